"""Our language models in lm-evaluation-harness (`pip install "grassflow[eval]"`):

    grassflow lm-eval --model grassflow --model_args pretrained=DIR --tasks wikitext ...

DIR: an export (`grassflow export`) or a finished run directory. `grassflow lm-eval` is lm-eval's
own command line (every option is lm-eval's) with the model "grassflow" registered first: lm-eval
0.4.13 finds models in a fixed table (lm_eval/models/__init__.py), with no plugin entry point, so a
bare `lm_eval --model grassflow` cannot know us. From Python, `import grassflow.harness` registers
it for `lm_eval.simple_evaluate(model="grassflow", ...)`.

What the harness asks of a model, as its own Hugging Face model (HFLM) answers it:
  loglikelihood          (context, continuation): the continuation's log-probability given the
                         context, its last L+1 tokens at most (L: the model's context_len);
  loglikelihood_rolling  a document's log-probability: the harness's disjoint windows
                         (lm_eval.utils.get_rolling_token_windows, context_len=1) after the
                         prefix token;
  generate_until         greedy decoding (grassflow.decode) until a stop string or max_gen_toks.
Texts are encoded by the model's tokenizer without special tokens, as the pipeline encodes its
corpus (a literal `<unk>` as one unknown token where the model was trained on Wikitext-2 v1 so read:
tokenizer.map_unk). The prefix token (what the first token of a document is conditioned on; HFLM
uses the tokenizer's end-of-text token, which a BERT tokenizer lacks) is `prefix_token`, by default
[SEP] (bert-base-uncased) or [PAD] (the pipeline's trained tokenizers): our models never saw it in
training, so it is a convention, stated, not a learnt start. grassflow.lm.rolling computes the
wikitext task's number without lm-eval, and the pipeline's evaluation reports it
(tests/lm/test_harness.py checks they agree).
"""

from __future__ import annotations

import sys

import torch

from grassflow.errors import MissingExtra

try:
    from lm_eval import utils
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:  # an optional extra: say which (the CLI prints it as its one error line)
    raise MissingExtra(
        f"grassflow lm-eval needs lm-evaluation-harness ({e}): pip install 'grassflow[eval]'"
    ) from e

from grassflow.decode import generate, open_model
from grassflow.lm.rolling import encode, prefix_id, score


@register_model("grassflow")
class GrassflowLM(LM):
    def __init__(
        self,
        pretrained: str,
        device: str = "cpu",
        batch_size=16,
        max_batch_size=None,
        prefix_token: str | None = None,
        max_gen_toks=256,
    ):
        super().__init__()
        self.model, self.tokenizer, self.unk_id = open_model(pretrained, device)
        self.dev = torch.device(device)
        self.L = self.model.cfg.context_len
        # "auto" (not measured): 16
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16
        del max_batch_size  # what "auto" would cap
        self.prefix = prefix_id(self.tokenizer, prefix_token)
        self.max_gen_toks = int(max_gen_toks)

    def tok_encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text, self.unk_id)

    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(log-probability of the continuation, whether greedy decoding gives it) of each (context,
        continuation): the model reads the last L+1 tokens of both, less the last. A continuation
        must have a token and fit the context (HFLM asserts the same)."""
        for c, x in pairs:
            if not x:
                raise ValueError(
                    f"an empty continuation (after a context of {len(c)} tokens) has no "
                    "log-probability to score"
                )
            if len(x) > self.L:
                raise ValueError(
                    f"a continuation of {len(x)} tokens does not fit the model's context of "
                    f"{self.L} (context_len)"
                )
        return score(
            self.model,
            [((c + x)[-(self.L + 1) :][:-1], x) for c, x in pairs],
            self.batch_size,
            self.dev,
        )

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = []
        for context, continuation in (r.args for r in requests):
            # HFLM's split: the context's trailing spaces belong to the continuation
            n_spaces = len(context) - len(context.rstrip())
            context, continuation = (
                context[: len(context) - n_spaces],
                context[len(context) - n_spaces :] + continuation,
            )
            pairs.append((self.tok_encode(context) or [self.prefix], self.tok_encode(continuation)))
        return self._score(pairs)

    def loglikelihood_rolling(self, requests) -> list[float]:
        out = []
        for (text,) in (r.args for r in requests):
            windows = [
                utils.make_disjoint_window(w)
                for w in utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix,
                    max_seq_len=self.L,
                    context_len=1,
                )
            ]
            out.append(sum(ll for ll, _ in self._score(windows)))
        return out

    def generate_until(self, requests) -> list[str]:
        out = []
        for context, gen_kwargs in (r.args for r in requests):
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else until
            ids = self.tok_encode(context) or [self.prefix]
            n = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
            new = generate(self.model, torch.tensor([ids], device=self.dev), n, temperature=0.0)[
                0, len(ids) :
            ]
            text = self.tokenizer.decode(new.tolist())
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out


def main(argv=None) -> None:
    """`grassflow lm-eval ...`: lm-eval's command line, with --model grassflow registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()
