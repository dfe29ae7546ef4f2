"""Model specs: a :class:`~synth.planner.transformer.Transformer` from a
shipped name, a YAML file or inline fields, checked field by field.

:func:`load_model` takes a shipped name (``gpt3-175b``, a file of
``models/``), a YAML path, or inline text
(``layers=30,hidden=3072,heads=32,seq=2048,vocab=51200``, which
:func:`parse_inline_model` reads); :func:`model_from_dict` builds the model
from a file's mapping (the fields of ``data/README.md``; the MLP's family gives
the defaults of the fields not given, :func:`~synth.planner.transformer.family_defaults`).
Every bad field is one :class:`~synth.errors.SynthError` that names the spec's
source and the field; every size is bounded by :data:`MODEL_LIMITS`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..documents import read_yaml
from ..errors import SynthError
from ..resources import models_dir
from ..units import MAX_COUNT, bounded_int, shown_number
from .transformer import MLA, MoE, Transformer, family_defaults

# field -> (type, required); the files' other keys are informative
_INT_FIELDS = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads", "params", "head_dim",
               "train_batch_tokens")
_COUNT_FIELDS = ("mtp_depth",)  # integers that may be 0
_REQUIRED = ("layers", "hidden", "heads", "seq", "vocab")
_BOOL_FIELDS = ("gated_mlp", "biases", "tied_embeddings")
_TEXT_FIELDS = ("name", "description", "source", "source_inconsistency")
_FRACTION_FIELDS = ("dropout", "attention_dropout")  # numbers from 0 to below 1
# architecture choices: field -> its values (the first of each is the GPT default, :func:`model_from_dict`)
_CHOICE_FIELDS = {"mlp": ("gelu", "swiglu", "relu", "squared_relu"), "norm": ("layernorm", "rmsnorm"),
                  "positions": ("learned", "rotary")}
# the largest value of each model size: far above any model trained today (the largest have about 10^2 layers,
# 2.5 x 10^4 hidden, 10^2 heads, 2.6 x 10^5 vocabulary, 4 x 10^2 experts, 10^6-10^7 tokens of context), so that
# a typo of many digits is one error line, not a plan of "25 billion GiB per device"
MODEL_LIMITS = {"layers": 10_000, "hidden": 2**20, "heads": 2**16, "kv_heads": 2**16, "head_dim": 2**16,
                "ffn": 2**22, "vocab": 2**24, "seq": 2**24, "params": 10**15,
                "train_batch_tokens": 10**15, "experts": 2**16, "top_k": 2**16, "expert_ffn": 2**22, "shared_experts": 2**16,
                "dense_layers": 10_000, "max_nodes": 2**16, "mtp_depth": 10_000, "q_lora_rank": 2**20,
                "kv_lora_rank": 2**20, "qk_rope_head_dim": 2**16, "qk_nope_head_dim": 2**16, "v_head_dim": 2**16}
# the moe: block's fields (inline: given flat, e.g. experts=8,top_k=2,expert_ffn=14336)
MOE_FIELDS = ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers", "max_nodes", "capacity_factor")
# the mla: block's fields, all required (multi-head latent attention, transformer.MLA; inline: given flat)
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
INLINE_FIELDS = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads", "head_dim", "mlp", "gated_mlp",
                 "biases", "norm", "positions", "tied_embeddings", "mtp_depth", "dropout", "attention_dropout") + MOE_FIELDS \
                + MLA_FIELDS


def model_from_dict(data: Any, source: str) -> Transformer:
    """Build and check a model; errors name ``source`` and the field."""
    if not isinstance(data, dict):
        raise SynthError(f"{source}: expected a mapping with keys {', '.join(_REQUIRED)}")
    allowed = (_INT_FIELDS + _COUNT_FIELDS + _BOOL_FIELDS + _TEXT_FIELDS + _FRACTION_FIELDS + tuple(_CHOICE_FIELDS)
               + ("moe", "mla"))
    for key in data:
        if key not in allowed:
            raise SynthError(f"{source}: unknown model field '{key}'; known fields are {', '.join(allowed)}")
    for key in _REQUIRED:
        if key not in data:
            raise SynthError(f"{source}: missing model field '{key}', e.g. {key}=2048")
    for key in _INT_FIELDS:
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SynthError(f"{source}: model field '{key}' must be an integer >= 1, got {value!r}")
            if value > MODEL_LIMITS.get(key, value):
                raise SynthError(f"{source}: model field '{key}' is {shown_number(str(value))}; at most "
                                 f"{MODEL_LIMITS[key]:,} (far above any model trained today)")
    for key in _COUNT_FIELDS:
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SynthError(f"{source}: model field '{key}' must be an integer >= 0 (0: none), got {value!r}")
            if value > data["layers"]:
                raise SynthError(f"{source}: model field '{key}' is {shown_number(str(value))}; at most the model's "
                                 f"layers ({data['layers']}): each depth is one more transformer block")
    for key in _BOOL_FIELDS:
        if key in data and not isinstance(data[key], bool):
            raise SynthError(f"{source}: model field '{key}' must be true or false, got {data[key]!r}")
    for key in _FRACTION_FIELDS:
        value = data.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise SynthError(f"{source}: model field '{key}' must be a number from 0 to below 1 (0: none), "
                             f"got {value!r}")
    for key in _TEXT_FIELDS:
        if key in data and not isinstance(data[key], str):
            raise SynthError(f"{source}: model field '{key}' must be text, got {data[key]!r}")
    for key, values in _CHOICE_FIELDS.items():
        if key in data and data[key] not in values:
            raise SynthError(f"{source}: model field '{key}' must be one of {', '.join(values)}, got {data[key]!r}")
    mlp = data.get("mlp", "swiglu" if data.get("gated_mlp") else "gelu")
    if "gated_mlp" in data and data["gated_mlp"] != (mlp == "swiglu"):
        raise SynthError(f"{source}: model fields 'gated_mlp' ({str(data['gated_mlp']).lower()}) and 'mlp' ({mlp}) "
                         "disagree: gated_mlp true is mlp swiglu; give one of them")
    gated, defaults = mlp == "swiglu", family_defaults(mlp)
    heads, hidden = data["heads"], data["hidden"]
    biases = bool(data.get("biases", defaults["biases"]))
    mla = _mla_from(data["mla"], data, biases, source) if data.get("mla") is not None else None
    if hidden % heads and "head_dim" not in data and mla is None:
        raise SynthError(f"{source}: model field 'heads' ({heads}) must divide hidden ({hidden}): every head has "
                         "hidden / heads dimensions (or give head_dim, as a source prints it)")
    kv_heads = data.get("kv_heads", heads)
    if heads % kv_heads:
        raise SynthError(f"{source}: model field 'kv_heads' ({kv_heads}) must divide heads ({heads})")
    if (hidden * kv_heads) % heads:
        raise SynthError(f"{source}: model field 'kv_heads': hidden x kv_heads / heads = {hidden} x {kv_heads} / "
                         f"{heads} is not an integer")
    if gated and "ffn" not in data:
        raise SynthError(f"{source}: model field 'ffn' is required with a SwiGLU MLP (its width)")
    moe = _moe_from(data["moe"], data["layers"], source) if data.get("moe") is not None else None
    return Transformer(
        name=str(data.get("name", Path(source).stem)),
        layers=data["layers"], hidden=hidden, heads=heads, seq=data["seq"], vocab=data["vocab"],
        ffn=data.get("ffn", 4 * hidden), kv_heads=kv_heads, mlp=mlp,
        biases=biases,
        norm=str(data.get("norm", defaults["norm"])),
        positions=str(data.get("positions", defaults["positions"])),
        tied_embeddings=bool(data.get("tied_embeddings", True)), moe=moe, head_dim=data.get("head_dim"), mla=mla,
        params_stated=data.get("params"), source=str(data.get("source", "")),
        source_inconsistency=data.get("source_inconsistency"), mtp_depth=data.get("mtp_depth", 0),
        dropout=float(data.get("dropout", 0.0)), attention_dropout=float(data.get("attention_dropout", 0.0)),
    )


def _mla_from(block: Any, data: dict[str, Any], biases: bool, source: str) -> MLA:
    """The ``mla:`` block (multi-head latent attention); errors name the field.
    Its heads are the model's ``heads``, each with its own keys and values
    (no ``kv_heads`` below heads), their widths the block's (no
    ``head_dim``), and its projections have no biases."""
    if not isinstance(block, dict):
        raise SynthError(f"{source}: model field 'mla' must be a mapping with {', '.join(MLA_FIELDS)}")
    for key in block:
        if key not in MLA_FIELDS:
            raise SynthError(f"{source}: unknown field 'mla.{key}'; known fields are {', '.join(MLA_FIELDS)}")
    for key in MLA_FIELDS:
        if key not in block:
            raise SynthError(f"{source}: missing field 'mla.{key}' (latent attention needs all of "
                             f"{', '.join(MLA_FIELDS)}; DeepSeek-V3's {key} is {_DEEPSEEK_V3_MLA[key]})")
        value = block[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SynthError(f"{source}: field 'mla.{key}' must be an integer >= 1, got {value!r}")
        if value > MODEL_LIMITS[key]:
            raise SynthError(f"{source}: field 'mla.{key}' is {shown_number(str(value))}; at most "
                             f"{MODEL_LIMITS[key]:,} (far above any model trained today)")
    if data.get("kv_heads", data["heads"]) != data["heads"]:
        raise SynthError(f"{source}: model field 'kv_heads' ({data['kv_heads']}) must equal heads ({data['heads']}) "
                         "with an mla: block: latent attention projects every head's keys and values (drop kv_heads)")
    if "head_dim" in data:
        raise SynthError(f"{source}: model field 'head_dim' cannot be given with an mla: block: its heads' widths "
                         "are mla.qk_nope_head_dim + mla.qk_rope_head_dim and mla.v_head_dim (drop head_dim)")
    if biases:
        raise SynthError(f"{source}: model field 'biases' must be false with an mla: block (latent attention's "
                         "projections have no biases; GPT's MLPs default to biases: give biases: false)")
    return MLA(*(block[key] for key in MLA_FIELDS))


# DeepSeek-V3's values (arXiv:2412.19437 Section 4.2), quoted in the errors as examples
_DEEPSEEK_V3_MLA = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128}


def _moe_from(block: Any, layers: int, source: str) -> MoE:
    """The ``moe:`` block; errors name the field."""
    if not isinstance(block, dict):
        raise SynthError(f"{source}: model field 'moe' must be a mapping with experts, top_k and expert_ffn")
    for key in block:
        if key not in MOE_FIELDS:
            raise SynthError(f"{source}: unknown field 'moe.{key}'; known fields are {', '.join(MOE_FIELDS)}")
    for key in ("experts", "top_k", "expert_ffn"):
        if key not in block:
            raise SynthError(f"{source}: missing field 'moe.{key}'")
    for key in MOE_FIELDS[:6]:
        value = block.get(key, 0)
        least = 1 if key in ("experts", "top_k", "expert_ffn") else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise SynthError(f"{source}: field 'moe.{key}' must be an integer >= {least}, got {value!r}")
        if value > MODEL_LIMITS.get(key, value):
            raise SynthError(f"{source}: field 'moe.{key}' is {shown_number(str(value))}; at most "
                             f"{MODEL_LIMITS[key]:,} (far above any model trained today)")
    if block["top_k"] > block["experts"]:
        raise SynthError(f"{source}: field 'moe.top_k' ({block['top_k']}) is more than moe.experts "
                         f"({block['experts']})")
    if block.get("dense_layers", 0) >= layers:
        raise SynthError(f"{source}: field 'moe.dense_layers' ({block['dense_layers']}) leaves no MoE layer of the "
                         f"{layers}")
    capacity = block.get("capacity_factor")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, (int, float))
                                 or not 1 <= capacity <= 64):
        raise SynthError(f"{source}: field 'moe.capacity_factor' must be a number from 1 to 64 or null (dropless), "
                         f"got {capacity!r}")
    return MoE(block["experts"], block["top_k"], block["expert_ffn"], block.get("shared_experts", 0),
               block.get("dense_layers", 0), None if capacity is None else float(capacity), block.get("max_nodes", 0))


def parse_inline_model(spec: str, option: str = "--model") -> Transformer:
    """A model from ``layers=30,hidden=3072,heads=32,seq=2048,vocab=51200``."""
    data: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        m = re.fullmatch(r"([a-z_]+)=(\S+)", item)  # no spaces in a key or around '='; ASCII names
        if not m:
            raise SynthError(f"{option} '{item}': expected FIELD=VALUE, e.g. {option} layers=30,hidden=3072,"
                             "heads=32,seq=2048,vocab=51200")
        key, value = m.group(1), m.group(2)
        if key not in INLINE_FIELDS:
            raise SynthError(f"{option}: unknown model field '{key}'; inline fields are {', '.join(INLINE_FIELDS)}")
        if key in data:
            raise SynthError(f"{option}: model field '{key}' is given twice")
        if key in _BOOL_FIELDS:
            if value not in ("true", "false"):
                raise SynthError(f"{option} {key}={value}: must be true or false")
            data[key] = value == "true"
        elif key in _CHOICE_FIELDS:
            data[key] = value  # model_from_dict names the values
        elif key in ("capacity_factor",) + _FRACTION_FIELDS:
            try:
                data[key] = float(value)
            except ValueError:
                raise SynthError(f"{option} {key}={value}: must be a number") from None
        elif not (value.isascii() and value.isdigit()):  # str.isdigit alone is true of superscripts
            raise SynthError(f"{option} {key}={value}: must be an integer >= 1")
        else:
            data[key] = bounded_int(value, f"{option} {key}=", MODEL_LIMITS.get(key, MAX_COUNT),
                                    low=0 if key in ("shared_experts", "dense_layers", "max_nodes", "mtp_depth") else 1)
    moe = {key: data.pop(key) for key in MOE_FIELDS if key in data}
    if moe:
        data["moe"] = moe
    mla = {key: data.pop(key) for key in MLA_FIELDS if key in data}
    if mla:
        data["mla"] = mla
    data["name"] = "inline"
    return model_from_dict(data, option)


def load_model(spec: str) -> Transformer:
    """A shipped model name (``gpt3-175b``), a YAML path, or inline fields."""
    if "=" in spec:
        return parse_inline_model(spec)
    path = Path(spec)
    if not path.is_file():
        shipped = models_dir() / (spec if spec.endswith(".yaml") else spec + ".yaml")
        if not shipped.is_file():
            known = ", ".join(sorted(p.stem for p in models_dir().glob("*.yaml")))
            raise SynthError(f"--model '{spec}': not a file, a shipped model ({known}) or inline fields "
                             "like layers=30,hidden=3072,heads=32,seq=2048,vocab=51200")
        path = shipped
    return model_from_dict(read_yaml(path, "model"), str(path))
