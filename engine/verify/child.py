"""The child process that builds and runs repository code (verification and benchmark).

Started by ``engine.verify.sandbox`` as ``python -I child.py JOB.json`` inside a temporary working
copy. It imports only the standard library and torch itself; everything else it imports is the
repository's code (a harness module, or a copy of a Hugging Face-style package), found through the
``sys_path`` entries of the job. It never imports ``engine``: the repository under test could
contain a package of that name.

Modes
  run    build each case's model, run it (eval and train mode, dropout off) and save outputs and
         gradients. The original side also saves the weights and inputs it used, and a float64 run
         as the reference for kernels more precise than the code they replace; the rewritten side
         loads those weights strictly and runs those inputs.
  bench  build one model and serve timing requests on a private pipe: JSON lines in on stdin, JSON
         lines out on the process's original stdout (user prints are sent to stderr).

The parent never trusts this process's verdict: it loads the tensors written here (with
``weights_only=True``) and compares them itself.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import platform
import random
import resource
import sys
import time
import traceback

import torch

# --------------------------------------------------------------------------------------------------
# Coverage: how often each kernel a rewrite introduces was called


class KernelCounter:
    """Counts calls of kernels named like a rule's `kernel`: a function (`torch.nn.functional.gelu`)
    or a constructor with a keyword it must be given (`torch.optim.AdamW(fused=True)`: counted only
    when `fused` is truthy). Installed before any repository code is imported, so that a rewrite's
    `torch.nn.functional.scaled_dot_product_attention(...)` goes through it; the parent compares
    the rewritten side's counts with the original's: a rewrite whose kernel never ran more often
    than in the original was not exercised, whatever its numbers say."""

    MAX_SITES = 256  # call sites kept per kernel

    def __init__(self, specs) -> None:
        self.counts: dict = {}
        self.sites: dict = {}  # spec -> "FILE:LINE" the call came from -> calls (coverage per call site)
        self.eligibility: dict = {}  # spec -> calls a fused kernel could take, calls only the math path can
        self.asking = True  # whether calls are offered to the fused backends (not on the probes' made-up inputs)
        for spec in specs or ():
            self._install(spec)

    def _install(self, spec: str) -> None:
        name, _, keyword = spec.partition("(")
        keyword = keyword.rstrip(")").partition("=")[0].strip() or None
        module_name, _, attr = name.rpartition(".")
        try:
            owner = importlib.import_module(module_name)
        except ImportError:
            return
        target = getattr(owner, attr, None)
        if target is None:
            return
        self.counts[spec] = 0
        counts = self.counts
        record = self._record
        if isinstance(target, type):
            original_init = target.__init__

            def init(obj, *args, __init=original_init, **kwargs):
                if keyword is None or kwargs.get(keyword):
                    counts[spec] += 1
                    record(spec)
                __init(obj, *args, **kwargs)

            target.__init__ = init
            return

        probe = _fused_eligibility if attr == "scaled_dot_product_attention" else None
        eligibility = self.eligibility
        counter = self

        def wrapper(*args, __fn=target, **kwargs):
            if keyword is None or kwargs.get(keyword):
                counts[spec] += 1
                record(spec)
                if probe is not None and counter.asking:
                    problem = probe(__fn, args, kwargs)
                    entry = eligibility.setdefault(spec, {"fused": 0, "math only": 0, "why": "", "sites": {},
                                                          "on": " ".join(filter(None, ELIGIBILITY_ON))})
                    entry["math only" if problem else "fused"] += 1
                    entry["why"] = entry["why"] or problem or ""
                    if problem:  # where the refused call came from: the parent blames only the rewrite's own calls
                        place = _place(sys._getframe(1))
                        if place in entry["sites"] or len(entry["sites"]) < KernelCounter.MAX_SITES:
                            entry["sites"][place] = entry["sites"].get(place, 0) + 1
            return __fn(*args, **kwargs)

        wrapper.__wrapped__ = target  # type: ignore[attr-defined]
        setattr(owner, attr, wrapper)

    def _record(self, spec: str) -> None:
        """Where the call came from: the frame that called the wrapper (repository code)."""
        place = _place(sys._getframe(2))
        sites = self.sites.setdefault(spec, {})
        if place in sites or len(sites) < self.MAX_SITES:
            sites[place] = sites.get(place, 0) + 1

    def take_sites(self) -> dict:
        """The call sites since the last take."""
        taken, self.sites = self.sites, {}
        return taken

    def take(self) -> dict:
        """The counts since the last take."""
        taken = dict(self.counts)
        for key in self.counts:
            self.counts[key] = 0
        return taken


def _place(frame) -> str:
    return f"{os.path.abspath(frame.f_code.co_filename)}:{frame.f_lineno}"


_ELIGIBLE: dict = {}  # a call's signature -> the fused backends' verdict (None: taken)
# Where the fused backends are asked: (device, dtype or None for the call's own); set from the job
# (VerifyConfig.eligibility_device/_dtype). Verification compares on the CPU, but a rewrite pays on
# the device it is benchmarked on, whose kernels refuse other calls (FlashAttention takes only
# half-precision inputs, and neither CUDA kernel takes 3-D or 5-D ones).
ELIGIBILITY_ON: tuple = ("cpu", None)


def _signature(args, kwargs) -> tuple | None:
    """What the fused backends' choice depends on: each tensor's shape, strides, dtype and device,
    and the other arguments' values; None where an argument is neither (no verdict is reused)."""
    def one(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), value.stride(), str(value.dtype), str(value.device))
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError
    try:
        return (tuple(one(a) for a in args),
                tuple(sorted((k, one(v)) for k, v in kwargs.items() if k != "dropout_p")))
    except TypeError:
        return None


def _fused_eligibility(fn, args, kwargs) -> str | None:
    """Whether a fused backend (FlashAttention, or the memory-efficient kernel; on the CPU its flash
    kernel) takes this call: the same call on detached copies with only those backends enabled must
    succeed. None when it does, else the kernel's reason (3-D or 5-D inputs, say): such a call falls
    back to the math path, which materializes the attention matrix and cannot pay. The verdict is
    kept per signature (shapes, strides, dtypes, devices, the other arguments), so each kind of call
    is tried once."""
    key = _signature(args, kwargs)
    if key is not None and key in _ELIGIBLE:
        return _ELIGIBLE[key]
    verdict = _try_fused(fn, args, kwargs)
    if key is not None and len(_ELIGIBLE) < 4096:
        _ELIGIBLE[key] = verdict
    return verdict


def _try_fused(fn, args, kwargs) -> str | None:
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    device, dtype = ELIGIBILITY_ON
    low = _DTYPES[dtype] if dtype else None

    def moved(value):
        if not isinstance(value, torch.Tensor):
            return value
        value = value.detach()  # strides kept: .to() of a non-contiguous tensor keeps its layout
        return value.to(device=device, dtype=low if low is not None and value.is_floating_point() else None)

    detached = [moved(a) for a in args]
    options = {k: moved(v) for k, v in kwargs.items()}
    options["dropout_p"] = 0.0
    import warnings

    with warnings.catch_warnings(record=True) as caught:  # the kernels say why in warnings
        warnings.simplefilter("always")
        try:
            with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                fn(*detached, **options)
        except RuntimeError as exc:
            reasons = [str(w.message).split(" (Triggered internally")[0] for w in caught
                       if "not used because" not in str(w.message)]
            return " ".join(" ".join(reasons or [str(exc)]).split())[:300]
    return None


def _eligibility_target(device: str, dtype: str | None) -> tuple:
    """(device, dtype) the fused backends are asked on; the CPU where the device asked for is not
    here (a note in each verdict's entry says which device answered)."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        device = "cpu"
    return device, (dtype if dtype in _DTYPES else None)


COUNTER = KernelCounter(())

# --------------------------------------------------------------------------------------------------
# Building models


def _accepts(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _load_harness(root: str, module_file: str):
    path = os.path.join(root, module_file)
    name = "adopter_harness_" + os.path.splitext(module_file)[0].replace("/", "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import harness {module_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Built:
    def __init__(self, model, inputs, optimizer=None, loss=None):
        self.model = model
        self.inputs = inputs
        self.optimizer = optimizer  # callable(model) -> optimizer, or None
        self.loss = loss  # callable(output, inputs) -> scalar, or None


def build_harness(target: dict, shape: dict, *, no_dropout: bool) -> Built:
    module = _load_harness(target["root"], target["module"])
    fn = getattr(module, target["function"], None)
    if fn is None:
        raise AttributeError(f"harness {target['module']} has no function {target['function']!r}")
    kwargs = {key: value for key, value in (shape or {}).items() if _accepts(fn, key)}
    if no_dropout and _accepts(fn, "dropout"):
        kwargs["dropout"] = 0.0
    result = fn(**kwargs)
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError(f"{target['module']}:{target['function']}() must return (model, inputs)")
    model, inputs = result
    if not isinstance(model, torch.nn.Module):
        raise TypeError("the harness's model is not a torch.nn.Module")
    return Built(model, inputs, getattr(module, "optimizer", None), getattr(module, "loss", None))


# Size settings for Hugging Face configs: every name that exists on the config is set.
_HF_SIZES = {
    "small": {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 64, "vocab": 99, "image": 32, "patch": 8},
    "bench": {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 4, "ffn": 1024, "vocab": 1000, "image": 224, "patch": 16},
}
_HF_KEYS = {
    "hidden": ("hidden_size", "d_model", "n_embd", "embed_dim"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers", "num_decoder_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", "decoder_attention_heads"),
    "kv_heads": ("num_key_value_heads",),
    "ffn": ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner"),
    "vocab": ("vocab_size",),
    "image": ("image_size",),
    "patch": ("patch_size",),
}
_HF_DROPOUT_KEYS = (
    "hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout", "dropout", "activation_dropout",
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout_rate", "hidden_dropout", "embed_dropout",
    "classifier_dropout", "summary_first_dropout", "encoder_layerdrop", "decoder_layerdrop", "layerdrop",
)


def _hf_config(config_class, size: str, seq_len: int, overrides: dict, no_dropout: bool):
    config = config_class()
    spec = _HF_SIZES[size]
    for group, names in _HF_KEYS.items():
        for name in names:
            if hasattr(config, name) and getattr(config, name) is not None:
                setattr(config, name, spec[group])
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int):  # special tokens of a large default vocabulary (Whisper's pad 50257) must fit
        names = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                 "cls_token_id", "unk_token_id", "mask_token_id")
        for offset, name in enumerate(names, start=1):  # distinct ids at the top of the small vocabulary
            value = getattr(config, name, None)
            if isinstance(value, int) and value >= vocab:
                setattr(config, name, vocab - offset)
    if hasattr(config, "d_kv"):  # T5-style: per-head width is its own setting
        config.d_kv = spec["hidden"] // spec["heads"]
    for name in ("max_position_embeddings", "n_positions", "max_target_positions", "max_source_positions"):
        if hasattr(config, name):
            setattr(config, name, max(64, 2 * seq_len + 2))
    if no_dropout:
        for name in _HF_DROPOUT_KEYS:
            if isinstance(getattr(config, name, None), float):
                setattr(config, name, 0.0)
    for name, value in (overrides or {}).items():
        setattr(config, name, value)
    return config


def _hf_inputs(model, config, batch: int, seq: int, generator) -> dict:
    params = inspect.signature(model.forward).parameters
    inputs: dict = {}
    vocab = int(getattr(config, "vocab_size", 99) or 99)
    if "input_ids" in params:
        inputs["input_ids"] = torch.randint(min(5, vocab - 1), vocab, (batch, seq), generator=generator)
        if "attention_mask" in params:
            mask = torch.ones(batch, seq, dtype=torch.long)
            if batch > 1:  # padding on the last row, so that masking paths run
                mask[-1, seq - max(1, seq // 4):] = 0
            inputs["attention_mask"] = mask
    elif "pixel_values" in params:
        size = int(getattr(config, "image_size", 32))
        channels = int(getattr(config, "num_channels", 3))
        inputs["pixel_values"] = torch.randn(batch, channels, size, size, generator=generator)
    elif "input_features" in params:  # speech encoders (Whisper): log-mel frames, two per encoder position
        frames = 2 * int(getattr(config, "max_source_positions", seq) or seq)
        mels = int(getattr(config, "num_mel_bins", 80) or 80)
        inputs["input_features"] = torch.randn(batch, mels, frames, generator=generator)
    elif "input_values" in params:  # raw-waveform speech encoders (Wav2Vec2, HuBERT): `seq` frames after the convolutions
        samples = _samples_for_frames(config, seq)
        inputs["input_values"] = torch.randn(batch, samples, generator=generator)
        if "attention_mask" in params:
            mask = torch.ones(batch, samples, dtype=torch.long)
            if batch > 1:  # padding on the last row, so that masking paths run
                mask[-1, samples - max(1, samples // 4):] = 0
            inputs["attention_mask"] = mask
    else:
        raise TypeError(f"no input recipe for {type(model).__name__}.forward{tuple(params)}")
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(min(5, vocab - 1), vocab, (batch, max(1, seq // 2)), generator=generator)
    return inputs


def _samples_for_frames(config, frames: int) -> int:
    """The waveform length whose feature encoder (the configuration's convolutions, last to first:
    n_in = (n_out - 1) * stride + kernel) gives `frames` frames."""
    kernels = list(getattr(config, "conv_kernel", ()) or ())
    strides = list(getattr(config, "conv_stride", ()) or ())
    length = max(1, frames)
    for kernel, stride in reversed(list(zip(kernels, strides, strict=True))):
        length = (length - 1) * int(stride) + int(kernel)
    return length


def build_hf(target: dict, shape: dict, *, no_dropout: bool, size: str) -> Built:
    module = importlib.import_module(target["module"])
    model_class = getattr(module, target["model_class"])
    batch, seq = int(shape.get("batch_size", 2)), int(shape.get("seq_len", 16))
    config = _hf_config(model_class.config_class, size, seq, target.get("config_overrides") or {}, no_dropout)
    model = model_class(config)
    generator = torch.Generator().manual_seed(1234 + batch * 1000 + seq)
    return Built(model, _hf_inputs(model, config, batch, seq, generator))


def build(target: dict, shape: dict, *, no_dropout: bool, hf_size: str = "small") -> Built:
    if target["kind"] == "harness":
        return build_harness(target, shape, no_dropout=no_dropout)
    if target["kind"] == "hf":
        return build_hf(target, shape, no_dropout=no_dropout, size=hf_size)
    raise ValueError(f"unknown target kind {target['kind']!r}")


# --------------------------------------------------------------------------------------------------
# Running


def zero_dropout(model) -> None:
    """Dropout off everywhere we can reach: dropout modules and float attributes named like it."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if isinstance(value, float) and "drop" in name.lower():
                setattr(module, name, 0.0)


SWITCHED_ON_P = 0.1


def switch_dropout_on(model) -> None:
    """Dropout on where the model ships it at 0 (Swin's attention dropout, a harness built with
    dropout 0): a rewrite must drop exactly when the original does for any probability, and at 0
    neither drops, so a kernel told to drop in eval mode would go unseen. Probabilities the model
    ships with are kept."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p == 0.0:
            module.p = SWITCHED_ON_P
        for name, value in list(vars(module).items()):
            if isinstance(value, float) and value == 0.0 and "drop" in name.lower():
                setattr(module, name, SWITCHED_ON_P)


def reinit(model, seed: int) -> None:
    """Replace the weights by ones drawn with a fan-in scale. Initialisers of research code often use
    tiny weights (std 0.02) under which attention is nearly uniform and a wrong scale goes unnoticed;
    an equivalent rewrite must agree for any weights."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if not param.is_floating_point():
                continue
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
            if param.dim() >= 2:
                param.copy_(noise / math.sqrt(max(1, param[0].numel())))
            else:
                param.add_(0.1 * noise.to(param.dtype))


def _map(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {key: _map(item, fn) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_map(item, fn) for item in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def _flatten(value, prefix: str, into: dict) -> None:
    if isinstance(value, torch.Tensor):
        into[prefix] = value
    elif isinstance(value, dict) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        for key in value.keys():
            _flatten(value[key], f"{prefix}.{key}", into)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _flatten(item, f"{prefix}.{index}", into)


def _cast_inputs(inputs, dtype, device):
    def cast(t):
        moved = t.detach().to(device)
        if t.is_floating_point():
            moved = moved.to(dtype)
        return moved.requires_grad_(t.requires_grad)

    return _map(inputs, cast)


def call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def loss_of(output, built: Built | None = None, inputs=None):
    if built is not None and built.loss is not None:
        return built.loss(output, inputs)
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    tensors: dict = {}
    _flatten(output, "out", tensors)
    floats = [t for t in tensors.values() if t.is_floating_point()]
    if not floats:
        raise TypeError("the model's output holds no floating-point tensor to take a loss of")
    return floats[0].float().pow(2).mean() if floats[0].dtype != torch.float64 else floats[0].pow(2).mean()


_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


RUN_SEED = 2024  # every compared run draws the same random numbers, on either side


def seed_run(seed: int = RUN_SEED) -> None:
    """Seed every generator a model may draw from in training mode: torch's, Python's and, where the
    model's code imported it, numpy's global one (Wav2Vec2's SpecAugment draws its time masks and
    their count from `np.random`; unseeded, the original's and the rewrite's runs masked different
    frames on some runs and compared different functions)."""
    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)


def run_once(built: Built, model, inputs, *, dtype: str, train: bool, step: bool, device: str = "cpu",
             step_grads: dict | None = None, loss_fn=None) -> dict:
    """Forward, backward (and one optimizer step) of a copy of ``model``; tensors by name.

    The optimizer step runs on ``step_grads`` where given (the original's gradients, by parameter
    name): one Adam step amplifies tiny gradient differences into sign flips, so the optimizer is
    checked on identical gradients and the model's gradients are checked on their own.
    ``loss_fn(output)`` replaces the harness's loss (the probes' own, see ``probe_loss``)."""
    torch_dtype = _DTYPES[dtype]
    model = copy.deepcopy(model).to(device=device, dtype=torch_dtype)
    model.train(train)
    inputs = _cast_inputs(inputs, torch_dtype, device)
    previous_default = torch.get_default_dtype()
    if torch_dtype == torch.float64:
        torch.set_default_dtype(torch.float64)  # tensors the model creates itself follow
    try:
        seed_run()
        output = call(model, inputs)
        loss = loss_fn(output) if loss_fn is not None else loss_of(output, built, inputs)
        if loss_fn is None or loss.requires_grad:  # a probe whose outputs all lost their gradient
            loss.backward()
        tensors: dict = {}
        _flatten(output, "out", tensors)
        tensors = {key: value for key, value in tensors.items() if value.is_floating_point()}
        tensors["loss"] = loss
        input_tensors: dict = {}
        _flatten(inputs, "input", input_tensors)
        for key, value in input_tensors.items():
            if value.requires_grad and value.grad is not None:
                tensors["grad/" + key] = value.grad
        for name, param in model.named_parameters():
            if param.grad is not None:
                tensors["grad/param." + name] = param.grad
        if step and built.optimizer is not None:
            optimizer = built.optimizer(model)
            if step_grads is not None:
                for name, param in model.named_parameters():
                    if name in step_grads:
                        param.grad = step_grads[name].to(device=param.device, dtype=param.dtype).clone()
            optimizer.step()
            for name, param in model.named_parameters():
                tensors["step/param." + name] = param
    finally:
        torch.set_default_dtype(previous_default)
    return {key: value.detach().to("cpu").clone() for key, value in tensors.items()}


def _classify(exc: BaseException) -> str:
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or "can't allocate memory" in text or "out of memory" in text:
        return "oom"
    return "error"


def _error(exc: BaseException, phase: str) -> dict:
    return {
        "status": _classify(exc),
        "phase": phase,
        "message": f"{type(exc).__name__}: {exc}"[:2000],
        "traceback": traceback.format_exc()[-6000:],
    }



def _differs(a, b) -> bool:
    """Whether two runs under different seeds differ as dropout makes them (elements zeroed, the rest
    scaled by 1/(1-p)), not by a reduction's rounding: threaded kernels need not sum in the same order
    twice, so bit equality would call a model that never drops one that does."""
    if a.shape != b.shape:
        return True
    a, b = a.double(), b.double()
    finite = torch.isfinite(a)
    if not torch.equal(finite, torch.isfinite(b)) or not torch.equal(a[~finite].nan_to_num(0), b[~finite].nan_to_num(0)):
        return True
    if not bool(finite.any()):
        return False
    scale = float(a[finite].abs().max())
    return bool(((a - b)[finite].abs() > 1e-4 * scale).any())


def shipped_probe(case: dict, job: dict, model, inputs, built: Built) -> dict:
    """Eval and train mode with dropout as the model ships, not forced off: `F.dropout(x, p)` drops
    in eval mode too, and a rewrite must drop exactly when the original does. The model is built
    again with its own dropout settings (switched on where they are 0, ``switch_dropout_on``) and
    given the weights in use; each mode runs twice under different seeds, and whether the two
    outputs differ says whether the model drops in that mode. The first eval output is kept for
    comparison where neither side drops."""
    try:
        again = build(case["target"], case.get("shape") or {}, no_dropout=False, hf_size=job.get("hf_size", "small"))
        shipped = again.model
        shipped.load_state_dict(model.state_dict(), strict=False)
    except Exception:  # noqa: BLE001 - a model that cannot be built twice is probed as built
        shipped = copy.deepcopy(model)
    switch_dropout_on(shipped)
    drops: dict = {}
    tensors: dict = {}
    with torch.no_grad():
        for mode in ("eval", "train"):
            shipped.train(mode == "train")
            outputs = []
            for seed in (11, 12):
                torch.manual_seed(seed)
                flat: dict = {}
                _flatten(call(shipped, _cast_inputs(inputs, torch.float32, "cpu")), "out", flat)
                outputs.append({k: v for k, v in flat.items() if v.is_floating_point()})
            drops[mode] = any(_differs(a, outputs[1].get(k, a)) for k, a in outputs[0].items())
            if mode == "eval":
                tensors = {k: v.detach().clone() for k, v in outputs[0].items()}
    return {"drops": drops, "tensors": tensors}


# --------------------------------------------------------------------------------------------------
# Probes: inputs the harness does not give, where rewrites of masks and kernels go wrong

MAX_MASK_PROBES = 2  # mask inputs probed per case (each with both of its extreme values)


def _input_names(model, inputs) -> dict:
    """Flattened input key ("input.0", "input.attention_mask") -> the name the model gives it: a
    positional input is named by the parameter of ``forward`` it binds to."""
    flat: dict = {}
    _flatten(inputs, "input", flat)
    names = {key: key for key in flat}
    if isinstance(inputs, (tuple, list)):
        try:
            params = [p.name for p in inspect.signature(model.forward).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            params = []
        for key in flat:
            index = key.split(".")[1]
            if index.isdigit() and int(index) < len(params):
                names[key] = key + "(" + params[int(index)] + ")"
    return names


def _mask_extremes(t) -> list:
    """The two values a mask input can hold everywhere: for a boolean or 0/1 mask both of them (one
    of them masks, whichever meaning the model gives it), for an additive float mask its lowest and
    its highest (the lowest of its dtype where it holds only zeros)."""
    if t.dtype == torch.bool:
        return [False, True]
    values = set(t.unique().tolist()[:3]) if t.numel() else set()
    if values <= {0, 1}:
        return [0, 1]
    if t.is_floating_point():
        low, high = float(t.min()), float(t.max())
        return [low, high] if low < high else []
    return []


def _set_masked(t, value, batch):
    """A copy of mask ``t`` with ``value`` on the last sample (a fully padded sample) and on the last
    query row of the first sample (a padded query: a row whose every key is masked). Returns the copy
    and the sample index that holds nothing but ``value`` (None where no whole sample is set)."""
    out = t.detach().clone()
    sample = None
    if out.dim() >= 1 and batch is not None and out.shape[0] == batch:
        out[-1] = value
        sample = -1
        if out.dim() >= 3 and batch > 1 and out.shape[-2] > 1:
            out[0, ..., -1, :] = value
    elif out.dim() >= 2 and out.shape[-2] > 1:
        out[..., -1, :] = value
    else:
        return None, None
    return out.requires_grad_(t.requires_grad), sample


def _replace(inputs, key: str, value, prefix: str = "input"):
    """``inputs`` with the tensor at flattened ``key`` replaced."""
    if prefix == key:
        return value
    if isinstance(inputs, dict):
        return {k: _replace(v, key, value, f"{prefix}.{k}") for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        items = [_replace(v, key, value, f"{prefix}.{i}") for i, v in enumerate(inputs)]
        return tuple(items) if isinstance(inputs, tuple) else items
    return inputs


def _non_contiguous(t):
    """The same values with other strides (the last two axes stored swapped): a kernel or a rewrite
    that assumes contiguous inputs shows it here."""
    if not isinstance(t, torch.Tensor) or t.dim() < 2 or t.shape[-1] < 2 or t.shape[-2] < 2:
        return t
    moved = t.detach().transpose(-2, -1).contiguous().transpose(-2, -1)
    return moved.requires_grad_(t.requires_grad)


def probe_variants(model, inputs) -> list:
    """Inputs beyond the harness's: each mask input set to each of its extreme values on a whole
    sample and on one query row (fully masked rows and samples; `masked_fill(mask == 0, -1e9)` keeps
    the plain average of v there, where a boolean mask without a fix-up gives NaN), and every input
    stored non-contiguously. Each entry: {"label", "inputs", "sample"}: ``sample`` is the index of a
    fully masked sample, whose outputs the probe's loss leaves out (see ``probe_loss``)."""
    flat: dict = {}
    _flatten(inputs, "input", flat)
    names = _input_names(model, inputs)

    def is_mask(key, t):
        return t.dtype == torch.bool or "mask" in names[key].rsplit(".", 1)[-1].lower()

    others = [t for key, t in flat.items() if not is_mask(key, t) and t.dim() >= 1]
    batch = int(others[0].shape[0]) if others else None
    variants = []
    masks = [(key, t) for key, t in flat.items() if is_mask(key, t)][:MAX_MASK_PROBES]
    for key, t in masks:
        for value in _mask_extremes(t):
            masked, sample = _set_masked(t, value, batch)
            if masked is None:
                continue
            shown = names[key].replace("|", "/")[:80]
            variants.append({"label": f"mask {shown}={value:g}" if not isinstance(value, bool) else f"mask {shown}={value}",
                             "inputs": _replace(inputs, key, masked), "sample": sample, "batch": batch})
    if any(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in flat.values()):
        variants.append({"label": "non-contiguous inputs", "inputs": _map(inputs, _non_contiguous), "sample": None,
                         "batch": batch})
    return variants


def probe_loss(sample, batch):
    """The probes' loss: a fixed random projection of every floating-point output, non-finite values
    read as 0 (a NaN row that the original gives under a -inf fill must be NaN in the rewrite too,
    and the gradients of everything else must still agree). A fully masked sample's outputs are
    left out of it: its forward is compared on every row, but what a training loss would take from
    a fully padded sample (nothing, where it ignores padding) is not what the probe asks about."""
    import zlib

    def loss(output):
        flat: dict = {}
        _flatten(output, "out", flat)
        total = None
        for key, t in sorted(flat.items()):
            if not t.is_floating_point() or not t.requires_grad:
                continue
            generator = torch.Generator().manual_seed(zlib.crc32(key.encode()))
            weight = torch.randn(t.shape, generator=generator, dtype=torch.float64)
            if sample is not None and t.dim() >= 1 and t.shape[0] == batch:
                weight[sample] = 0
            # summed in float64: a bfloat16 scalar of a few tens is rounded to 1/8, so a loss summed in the
            # run's dtype compares one rounding step, not the outputs (CLIP's failed so in bfloat16)
            term = (t.nan_to_num(0.0, 0.0, 0.0).double() * weight).sum()
            total = term if total is None else total + term
        return total if total is not None else torch.zeros(())

    return loss


def run_probes(built: Built, model, inputs, side: str, job: dict, saved: list | None) -> tuple:
    """Both sides run each probe in eval mode (dropout off): the input variants in the compared dtype
    (the original also in float64, the reference), and the harness's inputs in each low precision
    of ``job["low_precision"]`` (bfloat16, float16), held against the original's float64 run. ``saved``: the
    variants the original made (the rewritten side runs exactly those). Returns (the variants made,
    tensors by "probe:LABEL|DTYPE|KEY", probe label -> {"status", "message"})."""
    if not job.get("probes", True):
        return [], {}, {}
    variants = probe_variants(model, inputs) if saved is None else saved
    dtype = job.get("dtype", "float32")
    tensors: dict = {}
    report: dict = {}
    plans = [(v["label"], v["inputs"], probe_loss(v.get("sample"), v.get("batch")), dtype) for v in variants]
    plans += [(low, inputs, None, low) for low in job.get("low_precision", ()) if low != dtype]
    for label, probe_inputs, loss_fn, run_dtype in plans:
        dtypes = [run_dtype] + (["float64"] if side == "original" and loss_fn is not None and job.get("fp64", True) else [])
        try:
            for each in dtypes:
                out = run_once(built, model, probe_inputs, dtype=each, train=False, step=False, loss_fn=loss_fn)
                for key, value in out.items():
                    tensors[f"probe:{label}|{each}|{key}"] = value
            report[label] = {"status": "ok", "message": ""}
        except Exception as exc:  # noqa: BLE001 - a probe the original cannot run is a note, not a failure
            report[label] = {"status": _classify(exc), "message": f"{type(exc).__name__}: {exc}"[:1000]}
    return variants, tensors, report


def run_cases(job: dict) -> dict:
    side = job["side"]
    reference = None
    if side == "rewritten":
        reference = torch.load(job["reference_file"], weights_only=True)
    saved_state: dict = {}
    saved_tensors: dict = {}
    cases: dict = {}
    for case in job["cases"]:
        name = case["name"]
        phase = "build"
        try:
            torch.manual_seed(job["seed"])
            built = build(case["target"], case.get("shape") or {}, no_dropout=True, hf_size=job.get("hf_size", "small"))
            model = built.model
            if side == "original":
                if job.get("reinit", True):
                    reinit(model, job["seed"] + 1)
                saved_state["state/" + name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
                saved_state["inputs/" + name] = _map(built.inputs, lambda t: t.detach().clone().requires_grad_(t.requires_grad))
                inputs = built.inputs
            else:
                phase = "load_state_dict"
                state = reference.get("state/" + name)
                if state is None:
                    cases[name] = {"status": "skipped", "message": "the original side has no weights for this case"}
                    continue
                model.load_state_dict(state, strict=True)
                inputs = reference["inputs/" + name]
            phase = "eval (dropout as built)"
            shipped = shipped_probe(case, job, model, inputs, built)
            phase = "train (dropout as built)"
            smoke_model = copy.deepcopy(model)
            smoke_loss = loss_of(call(smoke_model.train(), _cast_inputs(inputs, torch.float32, "cpu")), built, inputs)
            smoke_loss.backward()
            smoke_finite = bool(torch.isfinite(smoke_loss).item())
            del smoke_model
            zero_dropout(model)
            runs = []
            kernel_calls: dict = {}
            COUNTER.take_sites()  # the compared runs' call sites only
            for mode in ("eval", "train"):
                dtypes = [job.get("dtype", "float32")]
                if side == "original" and job.get("fp64", True):
                    dtypes.append("float64")
                for dtype in dtypes:
                    phase = f"{mode} {dtype}"
                    step = mode == "eval" and dtype != "float64"
                    grads_key = f"grads/{name}"
                    COUNTER.take()
                    try:
                        tensors = run_once(built, model, inputs, dtype=dtype, train=mode == "train", step=step,
                                           step_grads=reference.get(grads_key) if reference is not None else None)
                    except Exception:
                        if dtype == "float64":  # a reference we cannot make is a note, not a failure
                            continue
                        raise
                    runs.append(f"{mode}|{dtype}")
                    kernel_calls[f"{mode}|{dtype}"] = COUNTER.take()
                    if step and side == "original":
                        saved_state[grads_key] = {k[len("grad/param."):]: v for k, v in tensors.items()
                                                  if k.startswith("grad/param.")}
                    for key, value in tensors.items():
                        saved_tensors[f"{name}|{mode}|{dtype}|{key}"] = value
            for key, value in shipped.pop("tensors").items():
                saved_tensors[f"{name}|shipped|{key}"] = value
            # of the compared runs only: the probes' made-up inputs (non-contiguous, fully masked) say
            # nothing of the calls the model makes, so they are not asked (COUNTER.asking below)
            eligibility = {k: {**v, "sites": dict(v["sites"])} for k, v in COUNTER.eligibility.items()}
            kernel_sites = COUNTER.take_sites()
            phase = "probes"
            COUNTER.take()
            COUNTER.asking = False
            try:
                variants, probe_tensors, probes = run_probes(
                    built, model, inputs, side, job, None if reference is None else reference.get("probes/" + name, []))
            finally:
                COUNTER.asking = True
            if side == "original":
                saved_state["probes/" + name] = variants
            for key, value in probe_tensors.items():
                saved_tensors[f"{name}|{key}"] = value
            cases[name] = {"status": "ok", "runs": runs, "train_smoke_finite": smoke_finite,
                           "kernel_calls": kernel_calls, "shipped": shipped, "probes": probes,
                           "kernel_sites": kernel_sites,
                           "kernel_eligibility": eligibility}
            COUNTER.take()
            COUNTER.take_sites()
            COUNTER.eligibility.clear()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a result
            cases[name] = _error(exc, phase)
            if cases[name]["status"] == "oom":
                break
    if side == "original":
        torch.save(saved_state, job["reference_file"])
    torch.save(saved_tensors, job["tensors_file"])
    return {"status": "ok", "cases": cases}


# --------------------------------------------------------------------------------------------------
# Benchmark server


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _reset_peak(cuda: bool) -> bool:
    """Start a new peak: CUDA's allocator statistics, or on Linux the process's high-water mark of
    resident memory (VmHWM; writing 5 to /proc/self/clear_refs sets it to the current RSS)."""
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        return True
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_since_reset(cuda: bool) -> int | None:
    if cuda:
        return int(torch.cuda.max_memory_allocated())
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def serve_bench(job: dict, channel) -> None:
    def reply(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    device, dtype = job.get("device", "cpu"), _DTYPES[job.get("dtype", "float32")]
    cuda = device.startswith("cuda")
    rss_start = _rss_bytes()
    try:
        torch.manual_seed(job["seed"])
        built = build(job["target"], job.get("shape") or {}, no_dropout=False, hf_size=job.get("hf_size", "bench"))
        model = built.model
        if job["side"] == "original":
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, job["state_file"])
        else:
            model.load_state_dict(torch.load(job["state_file"], weights_only=True), strict=True)
        model = model.to(device=device, dtype=dtype).train()
        inputs = _cast_inputs(built.inputs, dtype, device)
        optimizer = built.optimizer(model) if built.optimizer else torch.optim.AdamW(model.parameters(), lr=1e-4)
    except Exception as exc:  # noqa: BLE001
        reply(_error(exc, "build"))
        return
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss_ready = _rss_bytes()

    def step() -> float:
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(call(model, inputs), built, inputs)
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - started

    shapes = {}
    flat: dict = {}
    _flatten(inputs, "input", flat)
    for key, value in flat.items():
        shapes[key] = list(value.shape)
    reply({
        "status": "ready",
        "parameters": sum(p.numel() for p in model.parameters()),
        "input_shapes": shapes,
        "device_name": _device_name(device),
        "threads": torch.get_num_threads(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "platform": platform.platform(),
        },
    })
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "steps":
                # each round's own peak, so that memory gets an interval over rounds like time does
                resettable = bool(request.get("peak")) and _reset_peak(cuda)
                message: dict = {"status": "ok", "times": [step() for _ in range(int(request["n"]))]}
                peak = _peak_since_reset(cuda) if resettable else None
                if peak is not None:
                    message.update(peak_bytes=peak, base_bytes=0 if cuda else rss_start)
                reply(message)
            elif request["op"] == "memory":
                if cuda:
                    reply({"status": "ok", "peak_bytes": torch.cuda.max_memory_allocated(), "base_bytes": 0})
                else:
                    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
                    reply({"status": "ok", "peak_bytes": peak, "base_bytes": rss_start, "ready_bytes": rss_ready})
            elif request["op"] == "quit":
                reply({"status": "bye"})
                return
        except Exception as exc:  # noqa: BLE001
            reply(_error(exc, request.get("op", "?")))
            return


# --------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    with open(argv[1]) as handle:
        job = json.load(handle)
    global COUNTER, ELIGIBILITY_ON
    COUNTER = KernelCounter(job.get("count_kernels", ()))
    ELIGIBILITY_ON = _eligibility_target(job.get("eligibility_device") or "cpu", job.get("eligibility_dtype"))
    for entry in reversed(job.get("sys_path", [])):
        sys.path.insert(0, entry)
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    if job["mode"] == "bench":
        channel = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)  # whatever the repository prints goes to stderr, never into the protocol
        sys.stdout = sys.stderr
        serve_bench(job, channel)
        return 0
    try:
        result = run_cases(job)
    except Exception as exc:  # noqa: BLE001
        result = _error(exc, "run")
    with open(job["result_file"], "w") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
