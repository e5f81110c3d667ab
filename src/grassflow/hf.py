"""Our language models as transformers models: `import grassflow.hf`, then

    model = AutoModelForCausalLM.from_pretrained("exports/table1-grassmann-s0")
    tok = AutoTokenizer.from_pretrained("exports/table1-grassmann-s0")
    model.generate(**tok("the history of", return_tensors="pt"), max_new_tokens=20, do_sample=False)

An export (`grassflow export`) is a transformers model directory: its config.json names `model_type`
(grassflow_grassmann, grassflow_transformer), and it holds tokenizer_config.json. The classes wrap,
not copy, our modules: `GrassmannForCausalLM.model` is a GrassmannLM built from config.json as
grassflow.pretrained.load_model builds it, with its weights read and checked by it (strict config,
every tensor fitting, the weights' sha256). Decoding goes through transformers' cache API:
`GrassflowCache` holds, per layer, what grassflow.decode keeps — a Transformer's keys and values, a
Grassmann layer's last max(offsets) reduced states (its state does not grow) — so `generate()` feeds
only the new tokens; positions are learned absolute embeddings, so a text can be at most context_len
tokens long (grassflow generate slides its window; transformers' generate is refused past it, naming
the limit). A padded batch (an attention_mask with zeros, left or right) runs row by row, each row
its prompt alone: exact for both kinds.

Registration is `import grassflow.hf`, not `import grassflow`: a training or evaluation job imports
grassflow, and registering on its import would make this module part of every job's code
(grassflow.planning.staleness: editing it would rerun them) and cost every job transformers' import.
No trust_remote_code export: the export would carry a second copy of the models' code, or code that
imports grassflow anyway.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationMixin,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.modeling_outputs import CausalLMOutputWithPast

from grassflow.decode import Decoder
from grassflow.models import ModelConfig, build_model
from grassflow.pretrained import load_model

FIELDS = [f.name for f in dataclasses.fields(ModelConfig)]


class GrassflowConfig(PretrainedConfig):
    """config.json of an export: every ModelConfig field, the model kind, and what else the export
    records (the tokenizer, the weights' sha256, the run); `model_config()` is its ModelConfig."""

    model_type = "grassflow"

    def __init__(self, model_kind: str = "grassmann", **kwargs):
        defaults = ModelConfig()
        for name in FIELDS:
            setattr(self, name, kwargs.pop(name, getattr(defaults, name)))
        self.model_kind = model_kind
        kwargs.setdefault("tie_word_embeddings", self.tie_weights)
        super().__init__(**kwargs)
        # what the harness and generate read as the model's length
        self.max_position_embeddings = self.context_len

    def model_config(self) -> ModelConfig:
        return ModelConfig(**{name: getattr(self, name) for name in FIELDS})


class GrassmannConfig(GrassflowConfig):
    model_type = "grassflow_grassmann"

    def __init__(self, **kwargs):
        kwargs["model_kind"] = "grassmann"
        super().__init__(**kwargs)


class TransformerConfig(GrassflowConfig):
    model_type = "grassflow_transformer"

    def __init__(self, **kwargs):
        kwargs["model_kind"] = "transformer"
        super().__init__(**kwargs)


class _DecoderLayer(CacheLayerMixin):
    """One layer's view of a GrassflowCache, for transformers' bookkeeping (its length, beam
    reordering); the state itself is the Decoder's, which the model's layers read and extend."""

    is_compileable = False
    is_croppable = False

    def __init__(self, cache: GrassflowCache, index: int):
        super().__init__()
        self.cache, self.index = cache, index
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states):
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("a grassflow layer extends its own state (GrassflowCache.feed)")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.cache.seen

    def get_max_length(self) -> int:
        return self.cache.decoder.model.cfg.context_len

    def reorder_cache(self, beam_idx):
        if self.cache.rows is not None:
            raise NotImplementedError(
                "beam search over a padded batch: generate its prompts one at a time, or "
                "prompts of one length, or greedy/sampled decoding"
            )
        _, _, cached = self.cache.decoder.caches[self.index]
        for name in ("k", "v", "z"):
            if getattr(cached, name, None) is not None:
                setattr(
                    cached,
                    name,
                    getattr(cached, name).index_select(
                        0, beam_idx.to(getattr(cached, name).device)
                    ),
                )

    def reset(self):
        raise NotImplementedError("start a new GrassflowCache instead")


class GrassflowCache(Cache):
    """transformers' cache of one of our models: a grassflow.decode.Decoder (per layer, a
    Transformer's keys and values or a Grassmann layer's last max(offsets) reduced states), one for
    the batch, or, once a batch came padded, one per row (`rows`): each row then decodes exactly as
    its prompt alone, its own positions from 0."""

    def __init__(self, model):
        self.model = model
        self.decoder = Decoder(model)
        self.rows = None  # a Decoder per row, once padded
        self.seen = 0  # columns fed, padding included: transformers' sequence length
        super().__init__(layers=[_DecoderLayer(self, i) for i in range(len(model.blocks))])

    def feed(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) of the new columns `idx` (B, T); `attention_mask` transformers' mask of
        every column so far (B, seen + T). A padded column's logits are 0."""
        T = idx.shape[1]
        new = None if attention_mask is None else attention_mask[:, -T:].bool()
        if self.rows is None and (new is None or bool(new.all())):
            self._check(self.decoder.pos + T)
            out = self.decoder.feed(idx)
        else:
            if self.rows is None:
                if self.seen:
                    raise ValueError(
                        "padding after the first tokens: a batch is padded in its first call only"
                    )
                self.rows = [Decoder(self.model) for _ in range(idx.shape[0])]
            out = _per_row(
                idx,
                new,
                lambda b, ids: (
                    self._check(self.rows[b].pos + ids.shape[1]) or self.rows[b].feed(ids)
                ),
            )
        self.seen += T
        return out

    def _check(self, length: int) -> None:
        L = self.model.cfg.context_len
        if length > L:
            raise ValueError(
                f"a text of {length} tokens is longer than the model's context ({L} learned "
                "positions): "
                f"generate at most max_length={L} (grassflow generate slides its window instead)"
            )


def _per_row(idx: torch.Tensor, mask: torch.Tensor, logits_of) -> torch.Tensor:
    """Each row's real tokens (its mask's one run of ones: left or right padding) through
    `logits_of(row, ids (1, n))`, alone: the logits (B, T, V) of a batch of prompts of different
    lengths, each row exactly its prompt's, a padded column's 0."""
    out = None
    for b in range(idx.shape[0]):
        real = mask[b].nonzero().flatten()
        if not len(real):
            raise ValueError(f"row {b} of the batch is all padding")
        s, e = int(real[0]), int(real[-1]) + 1
        if e - s != len(real):
            raise ValueError(
                f"row {b}'s attention_mask has holes: padding on the left or the right only"
            )
        row = logits_of(b, idx[b : b + 1, s:e])
        if out is None:
            out = row.new_zeros(idx.shape[0], idx.shape[1], row.shape[-1])
        out[b, s:e] = row[0]
    return out


class GrassflowForCausalLM(PreTrainedModel, GenerationMixin):
    """A GrassmannLM or a TransformerLM (`.model`) as a transformers causal LM."""

    config_class = GrassflowConfig
    base_model_prefix = "model"
    _supports_cache_class = True

    def __init__(self, config: GrassflowConfig, model=None):
        super().__init__(config)
        self.model = (
            model if model is not None else build_model(config.model_kind, config.model_config())
        )

    @classmethod
    def from_pretrained(
        cls, path, *args, config=None, device_map=None, dtype=None, torch_dtype=None, **kwargs
    ):
        """An export (or a run directory) through grassflow.pretrained.load_model: the model its
        config.json describes, the weights checked. transformers' other loading options (hub,
        revisions, quantization) do not apply: the directory is local."""
        if (kwargs.pop("adapter_kwargs", None) or {}).get("_adapter_model_path"):
            raise TypeError(f"{path}: a PEFT adapter; load the export, then the adapter with peft")
        harmless = (
            "trust_remote_code",
            "revision",
            "low_cpu_mem_usage",
            "attn_implementation",
            "subfolder",
        )
        unused = {k: v for k, v in kwargs.items() if v and k not in harmless}
        if args or unused:
            raise TypeError(
                f"{cls.__name__}.from_pretrained takes a local directory; not "
                f"{list(unused) or args}"
            )
        device = (
            device_map if isinstance(device_map, str) and device_map not in ("auto",) else "cpu"
        )
        model = load_model(path, device)
        if config is None:
            config = AutoConfig.from_pretrained(path)
        out = cls._with(config, model)
        dtype = dtype or torch_dtype
        if dtype not in (None, "auto"):
            out = out.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        return out.eval()

    @classmethod
    def _with(cls, config, model):
        klass = {"grassmann": GrassmannForCausalLM, "transformer": TransformerForCausalLM}[
            config.model_kind
        ]
        return klass(config, model)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # its cache is a GrassflowCache, made by its first forward

    def save_pretrained(
        self,
        save_directory,
        is_main_process: bool = True,
        push_to_hub: bool = False,
        safe_serialization: bool = True,
        **kwargs,
    ):
        """The export layout (grassflow.pretrained.save_pretrained), which from_pretrained and
        load_model both read: model.safetensors in float32 with a tied head stored once, and our
        config.json. The tokenizer's record stays; the run's (spec, epoch, validation) stays only
        while the weights are still that run's. `model.push_to_hub(repo_id)` uploads this folder
        (transformers calls this method to write it)."""
        from grassflow.checkpoint import state_sha256
        from grassflow.pretrained import save_pretrained

        if push_to_hub:
            raise TypeError(
                "save_pretrained(push_to_hub=True): call model.push_to_hub(repo_id), which saves "
                "the same folder"
            )
        if not safe_serialization:
            raise TypeError(
                "save_pretrained: our weights are safetensors only (safe_serialization=True)"
            )
        if not is_main_process:
            return
        model = copy.deepcopy(
            self.model
        ).float()  # float32, as load_model rebuilds it: its sha256 is the one kept
        record = {k: v for k in ("tokenizer",) if (v := getattr(self.config, k, None)) is not None}
        if getattr(self.config, "weights_sha256", None) == state_sha256(model.state_dict()):
            record.update(
                {
                    k: v
                    for k in ("spec", "epoch", "val_loss", "val_metrics", "run")
                    if (v := getattr(self.config, k, None)) is not None
                }
            )
        save_pretrained(
            model,
            self.config.model_kind,
            save_directory,
            model_type=self.config.model_type,
            **record,
        )

    def get_input_embeddings(self):
        return self.model.tok_emb

    def get_output_embeddings(self):
        return self.model.head

    def _init_weights(self, module):
        pass  # built initialised by our modules, then loaded

    def forward(
        self,
        input_ids: torch.LongTensor,
        cache: Cache | None = None,
        attention_mask=None,
        labels=None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        if use_cache or cache is not None:
            cache = cache if cache is not None else GrassflowCache(self.model)
            logits = cache.feed(input_ids, attention_mask)
        elif attention_mask is not None and not bool(attention_mask.all()):
            logits = _per_row(input_ids, attention_mask.bool(), lambda b, ids: self.model(ids))
        else:
            logits = self.model(input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache else None)


class GrassmannForCausalLM(GrassflowForCausalLM):
    config_class = GrassmannConfig


class TransformerForCausalLM(GrassflowForCausalLM):
    config_class = TransformerConfig


# the auto classes: config.json's model_type -> its config and model class
for _config, _model in (
    (GrassmannConfig, GrassmannForCausalLM),
    (TransformerConfig, TransformerForCausalLM),
):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)
