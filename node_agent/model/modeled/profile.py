"""A modeled engine's profile: what one GPU (or group of GPUs) serving one model costs, as data.

Profiles are YAML files (the `profiles/` folder beside this module holds the packaged ones; a path
names any other). Every figure carries its source::

    name: h100-llama3-8b
    model: random-llama3-8b          # the model SPEC whose config (vocab, context, eos) requests see
    hardware: 1x H100 SXM 80GB, bf16
    figures:
      linear_s_per_token: {value: 3.3e-5, source: "2 * 8.03e9 FLOP / (989 TFLOPS * 0.5 MFU)"}
      ...

`ProfileError` (a ValueError) names the file and what is wrong with it.
"""

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

PROFILES_DIR = Path(__file__).parent / "profiles"


class ProfileError(ValueError):
    """A profile that cannot be loaded: missing, malformed, or with a figure out of range."""


@dataclass(frozen=True, slots=True)
class Figures:
    """The time model's figures (time_model.StepTimeModel says how a step combines them)."""

    step_overhead_s: float
    """Fixed cost of every step (launch, scheduling, sampling)."""
    weights_read_s: float
    """Streaming the weights once: the floor of a step's linear layers (decode is bandwidth-bound)."""
    linear_base_s: float
    """Fixed cost of the linear layers in a step that prefills: matrix-matrix products, for which a
    CPU BLAS packs the weights on every call (decode-only steps run matrix-vector products without
    it); 0 on a GPU."""
    linear_s_per_token: float
    """The linear layers' compute per token of the step (prefill and decode tokens alike)."""
    attention_s_per_token_pair: float
    """Prefill attention per (new token, token it attends to) pair."""
    kv_read_s_per_token: float
    """Decode attention: reading one token of KV context, per decoding sequence."""
    decode_s_per_seq: float
    """Fixed cost per decoding sequence (kernel work that does not scale with context; ~0 on a GPU)."""
    kv_bytes_per_token: int
    """The model's KV bytes per token (every layer, K and V): a pull's wire bytes and the pool's scale."""
    link_gbps: float
    """Bandwidth between nodes (GB/s, 1e9 bytes/s) that a pull's full KV bytes cross."""
    kv_capacity_tokens: int
    """Tokens of KV the device holds next to the weights: the default pool size."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise ProfileError(f"figure {f.name} must be a finite number >= 0, got {v!r}")
        for name in ("kv_bytes_per_token", "link_gbps", "kv_capacity_tokens"):
            if not getattr(self, name) > 0:
                raise ProfileError(f"figure {name} must be > 0, got {getattr(self, name)!r}")
        if self.weights_read_s + self.linear_s_per_token == 0:
            raise ProfileError("a profile whose steps cost nothing: weights_read_s or linear_s_per_token must be > 0")


@dataclass(frozen=True, slots=True)
class Profile:
    """One profile: its name, the model it serves, the hardware, the figures and each one's source."""

    name: str
    model: str
    hardware: str
    figures: Figures
    sources: dict[str, str]
    """Per figure name: where its value comes from (a citation, a measurement's command, a formula)."""
    notes: str = ""

    def describe(self) -> str:
        return f"modeled:{self.name} ({self.model} on {self.hardware})"


def profile_names() -> list[str]:
    """The packaged profiles, by name."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str) -> Profile:
    """The packaged profile `name_or_path`, or the YAML file at that path; ProfileError otherwise."""
    path = Path(name_or_path).expanduser()
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ProfileError(f"unknown profile {name_or_path!r}; valid: {', '.join(profile_names())}, "
                               "or a path to a .yaml file")
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ProfileError(f"profile {path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ProfileError(f"profile {path}: not valid YAML ({e})") from None
    try:
        return parse_profile(raw)
    except ProfileError as e:
        raise ProfileError(f"profile {path}: {e}") from None


def parse_profile(raw: Any) -> Profile:
    """A Profile from a YAML document's mapping; ProfileError naming the first problem."""
    if not isinstance(raw, dict):
        raise ProfileError("a profile is a mapping with name, model, hardware and figures")
    unknown = set(raw) - {"name", "model", "hardware", "figures", "notes"}
    if unknown:
        raise ProfileError(f"unknown keys {sorted(unknown)}; valid: name, model, hardware, figures, notes")
    for key in ("name", "model", "hardware"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ProfileError(f"{key} must be a non-empty string, got {raw.get(key)!r}")
    given = raw.get("figures")
    if not isinstance(given, dict):
        raise ProfileError("figures must be a mapping of figure name -> {value, source}")
    names = [f.name for f in fields(Figures)]
    missing = [n for n in names if n not in given]
    extra = sorted(set(given) - set(names))
    if missing or extra:
        raise ProfileError(f"figures missing {missing}, unknown {extra}; every profile gives exactly {names}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for n in names:
        entry = given[n]
        if not isinstance(entry, dict) or set(entry) != {"value", "source"}:
            raise ProfileError(f"figure {n} must be {{value: NUMBER, source: TEXT}}, got {entry!r}")
        if not isinstance(entry["source"], str) or not entry["source"].strip():
            raise ProfileError(f"figure {n} has no source: say where its value comes from")
        values[n], sources[n] = entry["value"], entry["source"]
    return Profile(raw["name"], raw["model"], raw["hardware"], Figures(**values), sources,
                   str(raw.get("notes", "")))
