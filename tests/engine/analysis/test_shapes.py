"""Shape and layout facts: ranks and axis identities proven from the code, or absent."""

from engine.analysis.shapes import ShapeFacts
from engine.dsl.ir import Const, Var
from engine.extract import extract_source


def facts(body: str, init: str = "pass", params: str = "x"):
    text = ("import torch\nfrom torch import nn\nimport einops\n\n\nclass M(nn.Module):\n"
            f"    def __init__(self, dim, heads):\n        super().__init__()\n        {init}\n\n"
            f"    def forward(self, {params}):\n" + "".join(f"        {line}\n" for line in body.strip().splitlines()))
    fm = extract_source(text, "m.py", "m")
    cls = fm.cls("M")
    method = cls.method("forward")
    return ShapeFacts(method, cls), method


def last(method, name: str) -> Var:
    """The SSA value of the last assignment of a Python name."""
    found = [o for n in method.nodes for o in n.outputs if o == name or o.startswith(name + ".")]
    return Var(found[-1])


def test_parameters_have_no_shape_and_reshape_proves_rank():
    f, m = facts("y = x.view(b, n, heads, d)\nz = y.permute(0, 2, 1, 3)", params="x, b, n, heads, d")
    assert f.shape(Var("x")) is None
    assert f.rank(last(m, "y")) == 4
    assert f.rank(last(m, "z")) == 4
    y, z = f.shape(last(m, "y")), f.shape(last(m, "z"))
    assert [a.id for a in z.axes] == [y.axes[i].id for i in (0, 2, 1, 3)]


def test_transpose_by_positive_dims_of_a_rank_4_value_swaps_the_last_two():
    f, m = facts("y = x.reshape(b, h, n, d)\nt = y.transpose(2, 3)\nu = y.transpose(1, 2)", params="x, b, h, n, d")
    defs = m.defs()
    assert f.swaps_last_two(defs[last(m, "t").name])
    assert not f.swaps_last_two(defs[last(m, "u").name])


def test_transpose_of_an_unknown_value_swaps_last_two_only_by_negative_dims():
    f, m = facts("t = x.transpose(2, 3)\nu = x.transpose(-1, -2)")
    defs = m.defs()
    assert not f.swaps_last_two(defs[last(m, "t").name])
    assert f.swaps_last_two(defs[last(m, "u").name])


def test_softmax_dim_after_bmm_is_the_last_axis_and_keeps_the_product_axes():
    f, m = facts("a = x.view(bh, n, d)\nb = y.view(bh, n, d)\ns = torch.bmm(a, b.transpose(1, 2))\np = s.softmax(dim=2)",
                 params="x, y, bh, n, d")
    s = last(m, "s")
    assert f.rank(s) == 3
    assert f.is_last(s, Const(2)) and not f.is_last(s, Const(1))
    p = f.shape(last(m, "p"))
    assert p.axes == f.shape(s).axes


def test_broadcast_with_an_unknown_operand_keeps_trailing_axes_but_not_the_rank():
    f, m = facts("s = x.view(b, h, n, n)\nt = s + mask", params="x, b, h, n, mask")
    t = f.shape(last(m, "t"))
    assert t.rank is None
    assert t.axes[-1].id == f.shape(last(m, "s")).axes[-1].id
    assert f.is_last(last(m, "t"), Const(-1)) and not f.is_last(last(m, "t"), Const(3))


def test_constructor_facts_give_parameters_size_1_trailing_axes():
    f, m = facts("y = x * self.temperature\nz = x * self.scale", params="x",
                 init="self.temperature = nn.Parameter(torch.ones(heads, 1, 1))\n"
                      "        self.scale = nn.Parameter(torch.log(10 * torch.ones((1, heads, 1, dim))))")
    assert f.attribute_shape("self.other") is None
    assert f.trailing_units(last(m, "y"), 2) is False  # x's rank is unknown: the product's is too
    temp = f.attribute_shape("self.temperature")
    assert temp.rank == 3 and [a.unit for a in temp.axes] == [False, True, True]
    scale = f.attribute_shape("self.scale")
    assert scale.rank == 4 and [a.unit for a in scale.axes] == [True, False, True, False]


def test_unsqueeze_unbind_index_and_einops():
    f, m = facts("qkv = x.view(b, n, 3, h, d).permute(2, 0, 3, 1, 4)\nq, k, v = qkv.unbind(0)\n"
                 "kk = k[:, None]\nr = einops.rearrange(q, 'b h n d -> b n (h d)')\nu = q.unsqueeze(-1)",
                 params="x, b, n, h, d")
    assert f.rank(last(m, "q")) == 4 and f.rank(last(m, "v")) == 4
    assert f.rank(last(m, "kk")) == 5 and f.shape(last(m, "kk")).axes[1].unit
    assert f.rank(last(m, "r")) == 3
    assert f.shape(last(m, "r")).axes[0].id == f.shape(last(m, "q")).axes[0].id
    assert f.rank(last(m, "u")) == 5 and f.shape(last(m, "u")).axes[-1].unit


def test_einsum_output_axes_follow_the_labels():
    f, m = facts("a = x.view(b, h, n, d)\nc = y.view(b, h, n, d)\n"
                 "s = torch.einsum('bhid,bhjd->bhij', a, c)\no = torch.einsum('bhij,bhjd->bhdi', s, c)",
                 params="x, y, b, h, n, d")
    s, o = f.shape(last(m, "s")), f.shape(last(m, "o"))
    assert s.rank == 4 and o.rank == 4
    assert o.axes[-1].id == s.axes[-2].id  # the query axis, read back channels-first


def test_reductions_with_keepdim_make_a_size_1_axis():
    f, m = facts("s = x.view(b, n, n)\nmx = s.amax(dim=-1, keepdim=True)\nsm = s.sum(-1)", params="x, b, n")
    mx = f.shape(last(m, "mx"))
    assert mx.rank == 3 and mx.axes[-1].unit and mx.axes[0].id == f.shape(last(m, "s")).axes[0].id
    assert f.rank(last(m, "sm")) == 2


def test_a_list_or_tuple_literal_of_axes_is_those_constant_axes():
    f, m = facts("s = x.view(b, n, -1)\nmu = s.mean(dim=[-1], keepdim=True)\nsq = s.sum([0, 2])\n"
                 "both = s.mean((-2, -1))\ngiven = s.mean([-1, k])", params="x, b, n, k")
    mu = f.shape(last(m, "mu"))
    assert mu.rank == 3 and mu.axes[-1].unit and mu.axes[1].id == f.shape(last(m, "s")).axes[1].id
    assert f.rank(last(m, "sq")) == 1 and f.rank(last(m, "both")) == 1
    assert f.shape(last(m, "given")) is None  # an axis only known at run time
    dims = {n.outputs[0].split(".")[0]: n.kwarg("dim", n.inputs[1] if len(n.inputs) > 1 else None)
            for n in m.nodes if n.op in ("mean", "sum")}
    assert f.constant_axes(dims["mu"]) == ((-1,), ()) and f.constant_axes(dims["sq"]) == ((0, 2), ())
    assert f.constant_axes(dims["both"]) == ((-2, -1), ()) and f.constant_axes(dims["given"]) is None


def test_a_merge_keeps_only_what_every_branch_proves():
    f, m = facts("s = x.view(b, n, n)\nif flag:\n    s = s + mask\np = s.softmax(-1)", params="x, b, n, mask, flag")
    p = f.shape(last(m, "p"))
    assert p is not None and p.rank is None
    assert f.is_last(last(m, "p"), Const(-1))


def test_a_shape_keeping_method_of_a_parameter_keeps_its_constructor_shape():
    f, m = facts("t = self.temperature.exp()\nu = self.temperature.unknown()", params="x",
                 init="self.temperature = nn.Parameter(torch.ones(heads, 1, 1))")
    assert f.trailing_units(last(m, "t"), 2)
    assert f.shape(last(m, "u")) is None


def test_a_tuple_of_axes_from_a_length_is_the_trailing_axes_only_where_every_length_agrees():
    body = """
k = len(shape)
a = tuple(range(-1, -k - 1, -1))
b = tuple(range(-k, 0))
c = tuple(-(i + 1) for i in range(len(self.shape)))
d = [-i for i in range(1, len(self.shape) + 1)]
e = tuple(range(-k, -1))
f = tuple(range(k))
g = tuple(-(i + 1) for i in range(len(self.shape) * 2))
h = tuple(range(-len(self.shape), 0)) + tuple(range(-1, -k - 1, -1))
"""
    f, m = facts(body, params="x, shape")
    for name in "ab":
        found = f.trailing_axes(last(m, name))
        assert found is not None and found[0] == Var("shape"), name
    for name in "cd":
        found = f.trailing_axes(last(m, name))
        assert found is not None and getattr(found[0], "text", None) == "self.shape", name
    for name in "efgh":  # one axis short, the leading axes, twice as many, two lengths
        assert f.trailing_axes(last(m, name)) is None, name


def test_dtype_facts_follow_elementwise_math_and_casts():
    f, m = facts("dtype = x.dtype\nm = x.amax(dim=-1, keepdim=True).detach()\ny = x / m\n"
                 "v = torch.var(y, dim=-1, unbiased=False, keepdim=True)\nr = (v + 1e-5).rsqrt()\n"
                 "a = r.type(dtype)\nb = r.float()\nc = b.float()\nd = r.to(w.dtype)\ne = r.type_as(x)\n"
                 "g = (r * w).type(dtype)", params="x, w")
    assert f.dtype(last(m, "r")) == "@x"
    cast = {n.outputs[0]: n for n in m.nodes if n.outputs}
    assert f.identity_cast(cast[last(m, "a").name]) and f.identity_cast(cast[last(m, "e").name])
    assert f.identity_cast(cast[last(m, "c").name])  # float32 already
    assert not f.identity_cast(cast[last(m, "b").name])  # x's dtype is not known to be float32
    assert not f.identity_cast(cast[last(m, "d").name])  # another tensor's dtype
    assert not f.identity_cast(cast[last(m, "g").name])  # r * w: two tensors of unrelated dtypes


def test_an_unflatten_to_sizes_read_from_a_tensor_has_that_tensors_axes():
    f, m = facts("v = x.view(b, h, j, w, d)\ny = torch.matmul(a, v.flatten(3)).unflatten(-1, (v.size(3), v.size(4)))\n"
                 "z = v.unflatten(-1, (v.size(3), n, 1))", params="x, a, b, h, j, w, d, n")
    v, y, z = (f.shape(last(m, name)) for name in ("v", "y", "z"))
    assert y.rank is None and [a.id for a in y.axes[-2:]] == [a.id for a in v.axes[3:]]
    assert z.rank == 7 and [a.id for a in z.axes[:5]] == [a.id for a in v.axes[:4]] + [v.axes[3].id]
    assert z.axes[-2].id not in {a.id for a in v.axes} and z.axes[-1].unit


def test_pieces_of_a_split_keep_the_rank_and_stacking_them_adds_an_axis():
    f, m = facts("y = x.view(b, n, d)\np = torch.split(y, s, dim=2)\nst = torch.stack(p, dim=0)\n"
                 "lt = torch.stack(y.chunk(2, -1), dim=-1)\nc = torch.cat(torch.split(st, 1, dim=0), dim=3)\n"
                 "first = y.split(s, -1)[0]\nrest = torch.stack(y.split(s, -1)[1:])\nu = torch.unbind(st)\n"
                 "back = torch.stack(u, 1)", params="x, b, n, d, s")
    y, st = f.shape(last(m, "y")), f.shape(last(m, "st"))
    assert st.rank == 4 and [a.id for a in st.axes[1:3]] == [a.id for a in y.axes[:2]]
    assert st.axes[3].id != y.axes[2].id  # the split axis has another size
    lt = f.shape(last(m, "lt"))
    assert lt.rank == 4 and [a.id for a in lt.axes[:2]] == [a.id for a in y.axes[:2]]
    assert f.rank(last(m, "c")) == 4
    assert f.rank(last(m, "first")) == 3  # an item of the tuple, not the tuple indexed as a tensor
    assert f.rank(last(m, "rest")) == 4
    assert f.rank(last(m, "back")) == 4


def test_stacking_values_of_unproven_or_different_ranks_proves_nothing():
    f, m = facts("y = x.view(b, n, d)\nz = x.view(b, n)\na = torch.stack([y, w])\nc = torch.stack([w, w])\n"
                 "e = torch.stack([y, z])\ng = torch.stack(pieces, dim=0)\nh = torch.cat(pieces, dim=0)\n"
                 "i = torch.stack(torch.split(w, s, dim=2), dim=0)\nj = torch.stack([w.transpose(-1, -2)], dim=-1)",
                 params="x, w, b, n, d, s, pieces")
    assert f.rank(last(m, "a")) == 4  # torch.stack raises unless both pieces have y's shape
    assert f.shape(last(m, "c")) is None
    assert f.shape(last(m, "e")) is None  # 3-D and 2-D pieces: it raises
    assert f.shape(last(m, "g")) is None and f.shape(last(m, "h")) is None  # a sequence of anything
    assert f.shape(last(m, "i")) is None  # a split of a value of unknown rank at a positive dim
    j = f.shape(last(m, "j"))
    assert j is not None and j.rank is None and len(j.axes) == 3  # trailing axes only


def test_the_rank_lost_before_a_stack_is_traced_to_the_parameter():
    f, m = facts("k = torch.stack(torch.split(self.proj(key), s, dim=2), dim=0)", params="key, s",
                 init="self.proj = nn.Linear(dim, dim)")
    assert f.rank_lost_at(last(m, "k")) == [Var("key")]


def test_a_branch_decided_by_a_proven_rank_merges_only_the_branch_taken():
    body = """
y = x.view(b, n, d)
r = y.dim()
if r == 2:
    y = y.unsqueeze(0)
elif r != 3:
    raise ValueError(r)
z = x.view(b, d)
if len(z.shape) == 2:
    z = z.unsqueeze(1)
w = x.view(b, n, d)
if not w.ndim == 3 and flag:
    w = w.flatten(1)
t = x.view(b, n, d)
if t.dim() - 1 == flag:
    t = t.flatten(1)
u = x.view(b, n, d)
if u.ndimension() == 3:
    u = u.unsqueeze(r - 3)
"""
    f, m = facts(body, params="x, b, n, d, flag")
    assert f.rank(last(m, "y")) == 3  # 3-D: the unsqueeze is not taken
    assert f.rank(last(m, "z")) == 3  # 2-D: it is
    assert f.rank(last(m, "w")) == 3  # `not True and ...` is False, whatever flag is
    assert f.rank(last(m, "t")) is None  # compared with a parameter: either branch
    u = f.shape(last(m, "u"))
    assert u.rank == 4 and u.axes[0].unit  # the unsqueeze's dim computed from the rank


def test_a_branch_on_the_rank_of_a_value_of_unknown_rank_proves_nothing():
    f, m = facts("if x.dim() == 3:\n    x = x.unsqueeze(1)\ny = x", params="x")
    assert f.shape(last(m, "y")) is None
    assert f.rank_lost_at(last(m, "y")) == [Var("x")]


def test_a_value_an_in_place_method_reshapes_has_no_proven_rank():
    f, m = facts("b, h, n, d = k.shape\nkk = k\nkk.unsqueeze_(0)\nt = k.transpose(2, 3)\n"
                 "y = x.view(b, h, n, d)\nz = y.contiguous()\nz.t_()\nw = x.view(b, n, d)\nw.mul_(2)",
                 params="k, x")
    assert f.shape(Var("k")) is None and f.shape(last(m, "t")) is None  # kk is k: it is 5-D after the call
    assert f.shape(last(m, "y")) is None  # .contiguous() may return y itself
    assert f.rank(last(m, "w")) == 3  # an in-place product keeps the shape
    lost = f.rank_lost_at(last(m, "t"))
    assert [n.op for n in lost] == [".unsqueeze_"]


def test_the_legacy_constructor_given_several_sizes_has_that_shape():
    f, m = facts("y = x", params="x",
                 init="self.w = nn.Parameter(torch.Tensor(2, dim))\n        self.t = nn.Parameter(torch.FloatTensor(1, dim))\n"
                      "        self.d = nn.Parameter(torch.Tensor(dim))\n        self.e = nn.Parameter(torch.Tensor([1.0, 2.0]))")
    assert f.attribute_shape("self.w").rank == 2
    t = f.attribute_shape("self.t")
    assert t.rank == 2 and t.axes[0].unit
    assert f.attribute_shape("self.d") is None and f.attribute_shape("self.e") is None  # one argument: sizes or data
