"""The pipeline's model as an lm-evaluation-harness model: its requests scored in batches by
pipeline.evaluation.scoring, tokenized exactly as the harness's Hugging Face backend tokenizes
them for the exported model (whose tokenizer gives sentencepiece's ids, no BOS or EOS added), so
the two give the same numbers. Imported only where lm_eval is installed."""

from __future__ import annotations

import time

from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import (
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)

from pipeline.evaluation.scoring import Scorer


class PipelineLM(TemplateLM):
    """`max_length`: the context the exported model declares (max_position_embeddings), the
    harness's cut for its inputs and rolling windows."""

    def __init__(self, scorer: Scorer, sp, max_length: int) -> None:
        super().__init__()
        self.scorer, self.sp, self.max_length = scorer, sp, max_length
        self.requests = 0  # answered, and the seconds spent on them: the speed reported
        self.seconds = 0.0

    @property
    def eot_token_id(self) -> int:
        return self.sp.eos_id()

    @property
    def prefix_token_id(self) -> int:
        # the Hugging Face backend's: BOS where the tokenizer has one, else EOS
        return self.sp.bos_id() if self.sp.bos_id() >= 0 else self.sp.eos_id()

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list:
        return self.sp.encode(string)

    def _timed(self, count: int, work):
        started = time.perf_counter()
        out = work()
        self.seconds += time.perf_counter() - started
        self.requests += count
        return out

    def _loglikelihood_tokens(self, requests, **kwargs) -> list[tuple[float, bool]]:
        pairs = [(context, continuation) for _, context, continuation in requests]
        return self._timed(len(pairs), lambda: self.scorer.loglikelihoods(pairs, self.max_length))

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """log p(text), over the harness's disjoint windows of max_length predictions, the first
        conditioned on the prefix token, each later one on the token before it."""
        windows, owner = [], []
        for n, request in enumerate(requests):
            for window in lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(request.args[0]),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            ):
                windows.append(lm_utils.make_disjoint_window(window))
                owner.append(n)
        scores = self._timed(
            len(requests), lambda: self.scorer.loglikelihoods(windows, self.max_length)
        )
        totals = [0.0] * len(requests)
        for n, (logprob, _) in zip(owner, scores, strict=True):
            totals[n] += logprob
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, cut at the first stop sequence (end-of-document among them);
        requests that ask for sampling are refused."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for n, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items())), []).append(n)
        for members in groups.values():
            options = normalize_gen_kwargs(requests[members[0]].args[1], 256)
            if options.get("do_sample"):
                raise ValueError("generate_until: only greedy decoding is supported (do_sample)")
            until = handle_stop_sequences(
                options.get("until"), eos=self.sp.id_to_piece(self.eot_token_id)
            )
            new = options["max_gen_toks"]
            room = self.max_length - new
            if room <= 0:
                raise ValueError(f"generate_until: max_gen_toks={new} leaves no room for context")
            contexts = [self.tok_encode(requests[n].args[0])[-room:] for n in members]

            def stopped(ids: list[int], until=until) -> bool:
                text = self.sp.decode(ids)
                return any(s and s in text for s in until)

            continuations = self._timed(
                len(members),
                lambda c=contexts, k=new, f=stopped: self.scorer.greedy(c, k, self.eot_token_id, f),
            )
            for n, ids in zip(members, continuations, strict=True):
                out[n] = postprocess_generated_text(self.sp.decode(ids), until, None)
        return out
