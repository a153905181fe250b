"""A Hugging Face config from `hf:<model_type>` or `hf:/path/to/folder`, and its task.

`hf:llama` builds `AutoConfig.for_model("llama", **fields)`: nothing is downloaded.
`hf:/path` reads the folder's config.json (a saved config or checkpoint), and notes
whether weights lie beside it. The workload's arguments are the config's fields
(`num_hidden_layers = 4`, `hidden_size = 256`, or a model's own names such as GPT-2's
`n_layer`); an unknown field is refused, as transformers itself would silently keep it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_harness.core.config import did_you_mean
from training_harness.core.errors import HarnessError
from training_harness.core.target import is_folder  # noqa: F401  (hf.py imports it here)
from training_harness.workloads import optional

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
           "pytorch_model.bin.index.json")
TASKS = ("auto", "causal-lm", "masked-lm", "seq2seq-lm")


@dataclass
class HFSource:
    spec: str  # what followed "hf:"
    config: Any  # a transformers PretrainedConfig, with the arguments applied
    task: str  # "causal-lm", "masked-lm" or "seq2seq-lm" (an encoder-decoder)
    folder: Path | None  # hf:/path: the folder
    weights: bool  # hf:/path: weights lie in the folder (loaded by build_model)

    @property
    def model_type(self) -> str:
        return self.config.model_type


def _known_fields(config: Any) -> set[str]:
    cls = type(config)
    return set(config.to_dict()) | set(getattr(cls, "attribute_map", {})) | set(vars(config))


def load_config(spec: str, fields: dict[str, Any], task: str = "auto") -> HFSource:
    """The config of `hf:<spec>` with `fields` set; a user's mistake is a HarnessError."""
    tf = optional.transformers()
    where = f"workload 'hf:{spec}'"
    if task not in TASKS:
        raise HarnessError(f"{where}: task '{task}' is not one of {', '.join(TASKS)}")
    folder = None
    if is_folder(spec):
        folder = Path(spec).expanduser().resolve()
        if not (folder / "config.json").is_file():
            raise HarnessError(f"{where}: no config.json in {folder}; give a folder saved with "
                               "save_pretrained (config.json, and weights if any)")
        try:
            config = tf.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        except Exception as e:  # transformers raises several kinds for a bad file
            raise HarnessError(f"{where}: cannot read {folder / 'config.json'} ({e})") from None
    else:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        if spec not in CONFIG_MAPPING_NAMES:
            raise HarnessError(
                f"{where}: transformers {tf.__version__} knows no model type '{spec}'"
                f"{did_you_mean(spec, CONFIG_MAPPING_NAMES)}; give a model_type such as "
                "llama, gpt2, bert, qwen2, mistral, or hf:/path/to/a/folder"
            )
        config = tf.AutoConfig.for_model(spec)
    known = _known_fields(config)
    for key in fields:
        if key not in known:
            raise HarnessError(
                f"{where}: '{key}' is not a field of {type(config).__name__}"
                f"{did_you_mean(key, known)}; the [workload] arguments are the config's fields "
                "plus seq_len, attn_implementation and task"
            )
    try:
        config = _rebuilt(config, fields, spec if folder is None else None)
    except Exception as e:  # the config's own validation
        raise HarnessError(f"{where}: {type(e).__name__}: {_one_line(e)}; fix the [workload] "
                           "arguments") from None
    config.use_cache = False  # training: no key/value cache
    weights = folder is not None and any((folder / w).is_file() for w in WEIGHTS)
    return HFSource(spec, config, _task(config, task, where), folder, weights)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).replace("\\n", " ").split())


def derived_fields(cls: Any, fields: dict[str, Any]) -> set[str]:
    """The fields a config's constructor derives from `fields`: those whose default
    changes when `fields` are given (qwen2's layer_types from num_hidden_layers ...)."""
    try:
        before, after = cls().to_dict(), cls(**fields).to_dict()
    except Exception:
        return set()
    return {k for k in before if k not in fields and before[k] != after.get(k)}


def _rebuilt(config: Any, fields: dict[str, Any], model_type: str | None) -> Any:
    """The config as transformers builds it: the fields go to the constructor, so the
    fields it derives from them follow (a folder's saved derived fields are dropped
    when the arguments change what they derive from)."""
    if model_type is not None:
        from transformers import AutoConfig

        return AutoConfig.for_model(model_type, **fields)
    if not fields:
        return config
    saved = config.to_dict()
    for key in derived_fields(type(config), fields):
        saved.pop(key, None)
    saved.pop("transformers_version", None)
    return type(config).from_dict({**saved, **fields})


def _task(config: Any, task: str, where: str) -> str:
    """Seq2seq for the encoder-decoders (T5, BART ...: copy with noise), masked LM for
    the model types transformers has a masked-LM head for (encoders: BERT, RoBERTa ...),
    next-token prediction for the causal LMs; `task` overrides."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    t = config.model_type
    can = {"causal-lm": t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
           "masked-lm": t in MODEL_FOR_MASKED_LM_MAPPING_NAMES,
           "seq2seq-lm": t in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES}
    if task == "auto":
        task = next((k for k in ("seq2seq-lm", "masked-lm") if can[k]), "causal-lm")
    if not can[task]:
        heads = [k for k, v in can.items() if v]
        raise HarnessError(
            f"{where}: transformers has no {task} model for '{t}'"
            + (f"; set task = '{heads[0]}'" if heads else
               "; only causal-LM, masked-LM and seq2seq-LM models can be trained here")
        )
    return task


def model_class(source: HFSource) -> Any:
    tf = optional.transformers()
    return {"masked-lm": tf.AutoModelForMaskedLM, "seq2seq-lm": tf.AutoModelForSeq2SeqLM}.get(
        source.task, tf.AutoModelForCausalLM)
