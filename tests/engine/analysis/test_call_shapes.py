"""Shape facts through calls (engine/analysis/shapes.py `ShapeFacts.returned`): the value a call of a
module returns has the rank its class's `forward` proves from the shapes of the call's arguments (a
norm or activation class of the repository, a torch.nn layer that keeps the shape), or none where the
callee is unknown or changes the rank."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from engine.scan import scan_path
from tests.engine.rules.harness import namespace, rewrite, statuses

ATTENTION = '''\
import torch
from torch import nn
{imports}

{callee}

class Attn(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.k_norm = {norm}

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        {call}
        attn = torch.matmul(q, k.transpose(2, 3)) * 0.125
        attn = attn.softmax(dim=-1)
        return torch.matmul(attn, v).transpose(1, 2).reshape(b, n, -1)
'''

RMS_NORM = '''\
class KeyNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
        return y.type_as(x) * self.weight
'''

# a module whose forward keeps the rank, returning a tuple (MViT's Pool returns the tensor and a size)
POOL = '''\
class Pool(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, size):
        b, h, n, d = x.shape
        x = x.reshape(b * h, n, d)
        x = self.norm(x)
        return x.reshape(b, h, n, d), size
'''

# forwards that change the rank: the key is no longer (b, h, n, d)
FLATTENS = '''\
class KeyNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x.flatten(0, 1) * self.weight
'''
ADDS_AXIS = '''\
class KeyNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x.unsqueeze(0) * self.weight
'''
# the rank kept on one path only
SOMETIMES = '''\
class KeyNorm(nn.Module):
    def __init__(self, dim, merge=False):
        super().__init__()
        self.merge = merge

    def forward(self, x):
        if self.merge:
            return x.flatten(1, 2)
        return x
'''
# a forward reading a submodule of unknown type
INJECTED = '''\
class KeyNorm(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return self.norm(x)
'''


def case(callee: str = "", norm: str = "KeyNorm(dim // heads)", call: str = "k = self.k_norm(k)",
         imports: str = "") -> str:
    return ATTENTION.format(callee=callee, norm=norm, call=call, imports=imports)


def test_a_norm_class_of_the_file_keeps_the_rank_and_the_rewrite_matches():
    source = case(RMS_NORM)
    new = rewrite(source)
    assert "scaled_dot_product_attention(q, k, v, scale=0.125)" in new
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    old_model, new_model = namespace(source)["Attn"](16, 2).eval(), namespace(new)["Attn"](16, 2).eval()
    new_model.load_state_dict(old_model.state_dict())
    assert torch.allclose(old_model(x), new_model(x), atol=1e-6)


def test_torch_nn_layers_that_keep_the_shape_keep_the_rank():
    for norm in ("nn.RMSNorm(dim // heads)", "nn.LeakyReLU(0.1)", "nn.Sequential(nn.LayerNorm(dim // heads), nn.Mish())"):
        found, _ = statuses(case(norm=norm))
        assert found == [("rewritten", None)], (norm, found)


def test_a_tuple_returned_by_a_module_gives_each_unpacked_name_its_shape():
    for call in ("k, size = self.k_norm(k, n)", "k = self.k_norm(k, n)[0]"):
        found, _ = statuses(case(POOL, norm="Pool(dim // heads)", call=call))
        assert found == [("rewritten", None)], (call, found)


def test_forwards_that_change_or_may_change_the_rank_leave_it_unproven():
    for callee, why in ((FLATTENS, "of a 3-D tensor"), (ADDS_AXIS, "of a 5-D tensor"),
                        (SOMETIMES, "not proven past `self.k_norm(...)`")):
        found, _ = statuses(case(callee))
        assert len(found) == 1 and found[0][0] == "near-miss", found
        assert why in found[0][1], found


def test_a_module_of_unknown_type_inside_the_callee_leaves_the_rank_unproven():
    found, _ = statuses(case(INJECTED, norm="KeyNorm(nn.LayerNorm(dim // heads))"))
    assert found[0][0] == "near-miss" and "not proven past `self.k_norm(...)`" in found[0][1]


def test_an_attribute_built_as_modules_of_different_types_on_two_paths_is_not_followed():
    source = case(RMS_NORM, norm="KeyNorm(dim // heads) if heads > 1 else nn.Linear(dim // heads, 1)")
    found, _ = statuses(source.replace(
        "        self.k_norm = KeyNorm(dim // heads) if heads > 1 else nn.Linear(dim // heads, 1)\n",
        "        if heads > 1:\n            self.k_norm = KeyNorm(dim // heads)\n"
        "        else:\n            self.k_norm = nn.Flatten(0, 1)\n"))
    assert found[0][0] == "near-miss", found


def test_a_call_passing_arguments_that_are_not_followed_proves_nothing():
    found, _ = statuses(case(RMS_NORM, call="k = self.k_norm(*[k])"))
    assert found[0][0] == "near-miss", found


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_a_norm_class_of_another_file_of_the_repository_keeps_the_rank(tmp_path: Path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/norms.py": "import torch\nfrom torch import nn\n\n\n" + RMS_NORM,
        "pkg/flat.py": "import torch\nfrom torch import nn\n\n\n" + FLATTENS,
        "pkg/attn.py": case(imports="from pkg.norms import KeyNorm"),
        "pkg/attn_flat.py": case(imports="from .flat import KeyNorm"),
    })
    result = scan_path(root, rules="sdpa-attention", rewrite=False)
    by_file = {f.file: f.status for f in result.findings if f.rule_id == "sdpa-attention"}
    assert by_file == {"pkg/attn.py": "rewritten", "pkg/attn_flat.py": "near-miss"}, by_file


GETTERS = '''\
import torch
from torch import nn


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class Grow(nn.Module):
    def forward(self, x):
        return x.unsqueeze(0)


def get_activation(act):
    funcs = {"relu": nn.ReLU, "tanh": torch.nn.Tanh, "swish": Swish}
    return funcs[act]()


def get_grow(act):
    if act == "relu":
        return nn.ReLU()
    return Grow()


class Attn(nn.Module):
    def __init__(self, dim, heads, act="swish"):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.act = {getter}(act)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        k = self.act(k)
        attn = torch.matmul(q, k.transpose(2, 3)) * 0.125
        attn = attn.softmax(dim=-1)
        return torch.matmul(attn, v)
'''


def test_an_activation_getter_returning_shape_keeping_modules_keeps_the_rank():
    source = GETTERS.replace("{getter}", "get_activation")
    new = rewrite(source)
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    for act in ("relu", "swish"):
        old_model, new_model = namespace(source)["Attn"](16, 2, act), namespace(new)["Attn"](16, 2, act)
        new_model.load_state_dict(old_model.state_dict())
        assert torch.allclose(old_model(x), new_model(x), atol=1e-6)


def test_a_getter_that_may_return_a_module_changing_the_rank_proves_nothing():
    found, _ = statuses(GETTERS.replace("{getter}", "get_grow"))
    assert found[0][0] == "near-miss" and "not proven past `self.act(...)`" in found[0][1], found


# MViT's Pool: helpers that add an axis to a 3-D input and take it away again, the branches decided
# by the rank of what the call passes (a 4-D key: neither is taken)
RANK_HELPERS = '''\
def _unsqueeze(x, target_dim, expand_dim):
    tensor_dim = x.dim()
    if tensor_dim == target_dim - 1:
        x = x.unsqueeze(expand_dim)
    elif tensor_dim != target_dim:
        raise ValueError("Unsupported input dimension")
    return x, tensor_dim


def _squeeze(x, target_dim, expand_dim, tensor_dim):
    if tensor_dim == target_dim - 1:
        x = x.squeeze(expand_dim)
    return x


class Pool(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        x, tensor_dim = _unsqueeze(x, {target}, 1)
        x = self.norm(x[..., ::2, :])
        return _squeeze(x, {target}, 1, tensor_dim)
'''


def test_branches_a_callee_takes_by_the_rank_of_its_argument_keep_the_rank():
    for target in (4, 5):  # 4: neither branch runs; 5: the axis added is taken away again
        found, _ = statuses(case(RANK_HELPERS.format(target=target), norm="Pool(dim // heads)"))
        assert found == [("rewritten", None)], (target, found)


def test_a_callee_whose_rank_helper_adds_an_axis_for_good_gives_a_5d_key():
    source = case(RANK_HELPERS.format(target=5).replace("        return _squeeze(x, 5, 1, tensor_dim)\n",
                                                        "        return x\n"), norm="Pool(dim // heads)")
    found, _ = statuses(source)
    assert found[0][0] == "near-miss" and "of a 5-D tensor" in found[0][1], found


def _line(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def test_the_near_miss_names_where_the_callee_loses_the_rank():
    source = case(RANK_HELPERS.format(target=4), norm="Pool(dim // heads)")
    found, _ = statuses(source.replace("Pool(dim // heads)", "Pool(None)").replace(
        "self.norm = nn.LayerNorm(dim)", "self.norm = dim if dim is not None else nn.Identity()"))
    call, inner = _line(source, "k = self.k_norm(k)"), _line(source, "x = self.norm(x[..., ::2, :])")
    assert found[0][0] == "near-miss" and found[0][1].endswith(
        f"not proven past `self.k_norm(...)` at line {call} (in `Pool.forward`, past `self.norm(...)` at line {inner})"
    ), found


def test_a_module_the_constructor_is_given_is_named_as_such():
    source = case(INJECTED, norm="KeyNorm(nn.LayerNorm(dim // heads))")
    found, _ = statuses(source)
    inner = _line(source, "return self.norm(x)")
    assert found[0][1].endswith(f"(in `KeyNorm.forward`, past `self.norm(...)` at line {inner} (from the "
                                "constructor's parameter `norm`, of any type))"), found


def test_a_callee_that_keeps_its_argument_s_rank_traces_the_loss_to_the_argument():
    source = case(RMS_NORM, call="k = self.k_norm(torch.flatten(k, 0, -1).view(*k.shape))")
    found, _ = statuses(source)
    assert found[0][0] == "near-miss" and "not proven past `.view(...)`" in found[0][1], found
