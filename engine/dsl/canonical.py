"""Canonical operations: one name for every spelling of the same tensor operation.

Rules are written against these names, so a rule need not list `a @ b`, `torch.matmul(a, b)`,
`torch.bmm(a, b)` and `a.matmul(b)` separately. The table is documented in docs/dsl.md.

Extraction applies it in three places:
  - functions, by fully qualified name (``FUNCTIONS``): ``torch.nn.functional.softmax`` -> softmax;
  - tensor methods, by method name (``METHODS``): ``x.softmax(-1)`` -> softmax;
  - Python operators (``BINARY``/``UNARY``): ``a @ b`` -> matmul, ``a + b`` -> add.
A function or method outside the tables keeps its qualified name (``torch.cat``) or its method
name with a leading dot (``.masked_fill``).

Each canonical op also fixes the order of its positional parameters (``SIGNATURES``) so that a
positional constant becomes a keyword: ``softmax(x, -1)`` and ``softmax(x, dim=-1)`` are one node
``softmax(x, dim=-1)``; the receiver of a method call is the first input.
"""

from __future__ import annotations

# canonical name -> names of positional parameters after the tensor input(s)
SIGNATURES: dict[str, tuple[str, ...]] = {
    "matmul": (),
    "softmax": ("dim",),
    "log_softmax": ("dim",),
    "transpose": ("dim0", "dim1"),
    "dropout": ("p", "training", "inplace"),
    "gelu": (),
    "relu": (),
    "silu": (),
    "sigmoid": (),
    "tanh": (),
    "erf": (),
    "exp": (),
    "sqrt": (),
    "rsqrt": (),
    "pow": ("exponent",),
    "mean": ("dim", "keepdim"),
    "var": ("dim",),
    "sum": ("dim", "keepdim"),
    "layer_norm": ("normalized_shape", "weight", "bias", "eps"),
    "rms_norm": ("normalized_shape", "weight", "eps"),
    "masked_fill": ("mask", "value"),
    "scaled_dot_product_attention": ("attn_mask", "dropout_p", "is_causal", "scale"),
}

# The number of leading tensor inputs of a canonical op (the rest are parameters).
TENSOR_ARITY: dict[str, int] = {"matmul": 2, "masked_fill": 1, "scaled_dot_product_attention": 3}

FUNCTIONS: dict[str, str] = {
    "torch.matmul": "matmul",
    "torch.bmm": "matmul",
    "torch.mm": "matmul",
    "torch.Tensor.matmul": "matmul",
    "torch.softmax": "softmax",
    "torch.nn.functional.softmax": "softmax",
    "torch.Tensor.softmax": "softmax",
    "torch.special.softmax": "softmax",
    "torch.log_softmax": "log_softmax",
    "torch.nn.functional.log_softmax": "log_softmax",
    "torch.transpose": "transpose",
    "torch.swapaxes": "transpose",
    "torch.swapdims": "transpose",
    "torch.nn.functional.dropout": "dropout",
    "torch.dropout": "dropout",
    "torch.nn.functional.gelu": "gelu",
    "torch.nn.functional.relu": "relu",
    "torch.relu": "relu",
    "torch.nn.functional.silu": "silu",
    "torch.sigmoid": "sigmoid",
    "torch.nn.functional.sigmoid": "sigmoid",
    "torch.tanh": "tanh",
    "torch.nn.functional.tanh": "tanh",
    "torch.erf": "erf",
    "torch.special.erf": "erf",
    "torch.exp": "exp",
    "torch.sqrt": "sqrt",
    "torch.rsqrt": "rsqrt",
    "torch.pow": "pow",
    "torch.mean": "mean",
    "torch.var": "var",
    "torch.sum": "sum",
    "torch.nn.functional.layer_norm": "layer_norm",
    "torch.layer_norm": "layer_norm",
    "torch.nn.functional.rms_norm": "rms_norm",
    "torch.masked_fill": "masked_fill",
    "torch.nn.functional.scaled_dot_product_attention": "scaled_dot_product_attention",
    "torch.add": "add",
    "torch.mul": "mul",
    "torch.sub": "sub",
    "torch.div": "div",
    "torch.true_divide": "div",
}

METHODS: dict[str, str] = {
    "matmul": "matmul",
    "bmm": "matmul",
    "mm": "matmul",
    "softmax": "softmax",
    "log_softmax": "log_softmax",
    "transpose": "transpose",
    "swapaxes": "transpose",
    "swapdims": "transpose",
    "tanh": "tanh",
    "erf": "erf",
    "exp": "exp",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "pow": "pow",
    "mean": "mean",
    "var": "var",
    "sum": "sum",
    "sigmoid": "sigmoid",
    "relu": "relu",
    "masked_fill": "masked_fill",
    "add": "add",
    "mul": "mul",
    "sub": "sub",
    "div": "div",
}

# Two-operand einsums that are batched matrix products are extracted as `matmul` (with a
# `transpose` of the second operand when it contracts over its last dimension): see
# `einsum_as_matmul` in engine/extract/extractor.py. The equation is the first argument of
# torch.einsum and the last of einops.einsum.
EINSUM_FUNCTIONS = {"torch.einsum", "torch.functional.einsum", "einops.einsum"}


def einsum_axes(spec: str, einops: bool) -> tuple[str, ...] | None:
    """The axis labels of one einsum operand: torch's one letter each (`bhid`, spaces ignored) or
    einops' names separated by spaces (`b h i d`); `...` is one label. None for anything fancier
    (parenthesized groups, anonymous axes)."""
    spec = spec.strip()
    if any(c in spec for c in "()0123456789"):
        return None
    if einops:
        return tuple(spec.split())
    spec = spec.replace(" ", "")
    axes, i = [], 0
    while i < len(spec):
        if spec.startswith("...", i):
            axes.append("...")
            i += 3
        elif spec[i].isalpha():
            axes.append(spec[i])
            i += 1
        else:
            return None
    return tuple(axes)


# ast operator class name -> canonical op
BINARY: dict[str, str] = {
    "MatMult": "matmul",
    "Add": "add",
    "Sub": "sub",
    "Mult": "mul",
    "Div": "div",
    "FloorDiv": "floordiv",
    "Mod": "mod",
    "Pow": "pow",
    "BitAnd": "and_",
    "BitOr": "or_",
    "BitXor": "xor",
    "LShift": "lshift",
    "RShift": "rshift",
}
UNARY: dict[str, str] = {"USub": "neg", "UAdd": "pos", "Invert": "invert", "Not": "not"}

# Layer types whose call is the same as a canonical op; the op's parameters come from the layer's
# constructor (by the listed positional order). A rule that asks for `softmax` also matches a call
# of an `nn.Softmax(dim=-1)` layer; the node itself stays a layer call (its attribute is needed to
# rewrite `__init__`).
LAYER_OPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch.nn.Softmax": ("softmax", ("dim",)),
    "torch.nn.LogSoftmax": ("log_softmax", ("dim",)),
    "torch.nn.Dropout": ("dropout", ("p", "inplace")),
    "torch.nn.GELU": ("gelu", ("approximate",)),
    "torch.nn.ReLU": ("relu", ()),
    "torch.nn.SiLU": ("silu", ()),
    "torch.nn.Sigmoid": ("sigmoid", ()),
    "torch.nn.Tanh": ("tanh", ()),
}

# Ops that are symmetric in their two dimension arguments: transpose(-1, -2) == transpose(-2, -1).
SYMMETRIC_DIMS = {"transpose"}

# Ops whose result is a Python number when applied to tensors with an index (x.size(-1)) or always
# (math.sqrt(d)): they make a value a scalar, so that `x / value` is a scale, not a tensor division.
SCALAR_FUNCTIONS = {
    "math.sqrt", "math.log", "math.exp", "math.pow", "math.ceil", "math.floor", "len", "int",
    "float", "max", "min", "round", "abs",
}
# numpy's elementwise functions: a number of a number (their result is a scalar where every argument is)
ELEMENTWISE_NUMPY = {"numpy.sqrt", "numpy.log", "numpy.exp", "numpy.power", "numpy.abs"}
SCALAR_METHODS = {"dim", "numel", "item", "ndimension", "element_size", "get_device"}
