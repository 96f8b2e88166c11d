"""The training loop: one for CPU and GPU around megatron-core's forward/backward
schedules, with validation, checkpoints, the best one kept, and a save before a time limit or
preemption. What differs by hardware comes from the backend (pipeline.model.backends)."""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import torch

from pipeline.config import PipelineConfig
from pipeline.config.derived import world_size
from pipeline.core import files, log, provenance
from pipeline.core.errors import NonFinite
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Interrupted
from pipeline.data import datasets, evalsets, sources
from pipeline.model import flops, moe
from pipeline.reporting.report import write_report
from pipeline.resilience import progress
from pipeline.runtime import placement
from pipeline.runtime.gpus import peak_tflops
from pipeline.training import checkpoint, checkpoint_records
from pipeline.training.engine import Engine
from pipeline.training.hooks import step_hooks
from pipeline.training.metrics import MetricsLog, Throughput, console_line
from pipeline.training.router_health import RouterHealth, warning_line
from pipeline.training.saver import CheckpointSaver
from pipeline.training.schedule import lr_scheduler
from pipeline.training.scoring_jobs import ScoringJobs
from pipeline.training.signals import StopRequest

_log = log.get()


class TrainRecord(TypedDict):
    """train/DONE.json: what the finished training run measured, and what it was made from."""

    made_from: dict  # (pipeline.core.provenance; pipeline.training.steps)
    fingerprint: str
    status: str  # "complete"
    train_steps: int
    tokens: int  # in the training split
    source_weights: dict[str, float]  # each source's share of the training samples
    trained_tokens: int
    vocab_size: int
    first_train_loss: float | None
    last_train_loss: float | None
    best_val_loss: float | None
    skipped_steps: int
    tokens_per_s: float
    parameters: int  # of the whole model, counted from it
    active_parameters: int  # what one token passes through (MoE: top_k experts per layer)
    best_checkpoint: str | None
    wall_seconds: float
    gpus: int
    gpu_hours: float


@dataclass
class RunState:
    step: int = 0
    consumed_samples: int = 0
    first_train_loss: float | None = None
    last_train_loss: float | None = None
    val_loss: float | None = None
    best_val_loss: float | None = None
    skipped_steps: int = 0
    skipped_in_a_row: int = 0  # non-finite steps since the last update (train.max_skipped_in_a_row)
    train_seconds: float = 0.0  # in training steps
    wall_seconds: float = 0.0  # of the stage, over all attempts, up to their last save
    tokens: int = 0
    scheduler: dict = field(default_factory=dict)


class Trainer(Engine):
    """Trains the model of `cfg` on the run's data; `made_from` (what its checkpoints and
    DONE.json record) says which settings and data that is."""

    def __init__(self, cfg: PipelineConfig, made_from: dict):
        self.made_from = made_from
        self.paths = RunPaths.of(cfg.workdir)
        self.manifest = datasets.load_manifest(self.paths)
        super().__init__(cfg, self.manifest["vocab_size"])
        ranks = world_size(cfg.cluster)
        if self.rank.world_size != ranks:  # the batch arithmetic assumed that many
            raise RuntimeError(
                f"the job has {self.rank.world_size} ranks but cluster.nodes x tasks per node "
                f"= {ranks}; launch one task per GPU as configured"
            )
        self.optimizer = self.backend.optimizer(self.chunks, cfg)
        self.scheduler = lr_scheduler(self.optimizer, cfg.train)
        self.metrics = MetricsLog(self.paths, self.is_logger, cfg)
        t = cfg.train
        self.saver = CheckpointSaver(
            self.paths.checkpoints,
            self.backend,
            t.keep_last,
            t.async_save,
            cfg.resilience.max_failed_saves,
        )
        self.scoring = ScoringJobs(cfg, starts=self.rank.is_first)
        self.throughput = self._throughput()
        self.router_health = RouterHealth.of(self.chunks, cfg)  # MoE models
        self.parameters, self.active_parameters = moe.parameter_counts(self.chunks, cfg.model)
        self.state = RunState()
        self._clock = time.time()  # this attempt's wall time is added to the state from here

    def iteration(self, iterators: list) -> tuple[float, float, bool]:
        for chunk in self.chunks:
            if hasattr(chunk, "zero_grad_buffer"):
                chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        micro, accum = self.settled.micro_batch_size, self.cfg.train.grad_accum
        total = self.run_schedule(iterators, accum, micro, forward_only=False)
        # The loss summed over the whole job (run_schedule all-reduces it), so every rank sees
        # the same value: never step on a non-finite one, even with finite gradients.
        loss = float(total[0] / total[1].clamp(min=1))
        if not math.isfinite(loss):
            return loss, math.nan, False
        progress.phase("optimizer")
        updated, grad_norm = self.optimizer.step()  # not updated: a non-finite gradient
        if updated:
            self.scheduler.step(1)
        return loss, float(grad_norm), updated

    def _skipped_update(self, loss: float, grad_norm: float) -> None:
        """A step whose update was skipped: stop, or say so, as train.nonfinite asks. Under fp16
        a finite loss with an overflowing gradient is the loss scaler at work, not a fault."""
        st, t = self.state, self.cfg.train
        what = f"step {st.step}: loss {loss:.6g}, grad norm {grad_norm:.6g}"
        scaler_overflow = t.precision == "fp16" and math.isfinite(loss)
        if t.nonfinite == "stop" and not scaler_overflow:
            self._saved(self.saver.wait())  # a save in flight holds earlier, finite weights
            raise NonFinite(
                f"{what} is not finite; stopped (train.nonfinite=stop) without saving, the "
                "earlier checkpoints are kept: lower train.lr or check the data, then rerun"
            )
        why = "fp16 loss-scale overflow" if scaler_overflow else "not finite"
        _log.info(
            f"{what}: {why}, update skipped ({st.skipped_steps} skipped so far, "
            f"train.nonfinite={t.nonfinite})"
        )
        if not scaler_overflow:
            st.skipped_in_a_row += 1
        if st.skipped_in_a_row >= t.max_skipped_in_a_row:
            self._saved(self.saver.wait())
            raise NonFinite(
                f"step {st.step}: the last {st.skipped_in_a_row} updates were all skipped as not "
                f"finite (train.max_skipped_in_a_row={t.max_skipped_in_a_row}): training has "
                "diverged; stopped without saving, the earlier checkpoints are kept: lower "
                "train.lr or check the data, then rerun"
            )

    # --- checkpoints --------------------------------------------------------------------------

    def resume(self) -> None:
        progress.phase("load")
        started = time.perf_counter()
        folder = checkpoint.latest(self.paths.checkpoints, collective=True)
        if folder is None:
            if self.cfg.model.init_from:
                self._start_from_hf(Path(self.cfg.model.init_from))
            return
        verified = time.perf_counter()
        self._check_resumable_layout(folder)
        saved = checkpoint.load(folder, self.backend, self.chunks, self.optimizer)
        self.state = RunState(**saved["run"])
        self.scheduler.load_state_dict(self.state.scheduler)
        took = time.perf_counter() - started
        _log.info(
            f"resumed from {folder} at step {self.state.step} (in {took:.1f} s: checksums "
            f"{verified - started:.1f} s, loading {took - verified + started:.1f} s)"
        )
        self.metrics.record(
            {
                "step": self.state.step,
                "resumed_from": folder.name,
                "resume_load_s": took,
                "resume_verify_s": verified - started,
            }
        )

    def _start_from_hf(self, init_from: Path) -> None:
        """model.init_from: the first rank converts the Llama's or Mixtral's weights (once),
        then every rank loads its part of them, as from a checkpoint."""
        from pipeline.model import dist_checkpoint
        from pipeline.model.huggingface.initial import convert

        started = time.perf_counter()
        target = self.paths.train_dir / "init"
        if self.rank.is_first:
            padded = self.parallel_layout()["padded_vocab_size"]
            convert(init_from, self.cfg.model, padded, target)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        dist_checkpoint.load_weights(target, self.chunks)
        self.optimizer.reload_model_params()  # the optimizer's own copy of the weights
        took = time.perf_counter() - started
        _log.info(f"started from the weights of {init_from} (in {took:.1f} s)")
        self.metrics.record({"step": 0, "initialized_from": str(init_from), "init_load_s": took})

    def _staged_bytes(self) -> int:
        """What this rank's share of a save copies to host memory: its weights, and in mixed
        precision the optimizer's fp32 main weights and two moments (12 bytes a weight; 8 in
        fp32), each written by one of the data-parallel ranks that hold it (an expert: one of
        the expert-data-parallel ranks). A little more, so that no tensor falls outside."""
        from megatron.core import parallel_state

        holders = {False: self.dp_size, True: parallel_state.get_expert_data_parallel_world_size()}
        per_weight = 8 if self.cfg.train.precision == "fp32" else 12  # optimizer bytes
        share = sum(
            p.numel() * (p.element_size() + per_weight) / holders[".mlp.experts." in name]
            for chunk in self.chunks
            for name, p in chunk.named_parameters()
        )
        return int(share * 1.02) + (64 << 20)

    def _check_resumable_layout(self, folder) -> None:
        """Refused before submission too (planning.preflight); here for a step called directly."""
        saved = files.read_json(folder / "state.json")
        layout = self.parallel_layout()
        problem = checkpoint_records.layout_problem(saved, layout)
        if problem:
            raise RuntimeError(f"{folder}: {problem[1]}")

    def _optimizer_sharding(self) -> str | None:
        """How the optimizer state is laid out in the checkpoints (a layout a resume must keep,
        for "dp_reshardable"); None: reshardable, whatever the layout."""
        sharding = getattr(self.optimizer, "sharding", None)
        uses_shards = self.cfg.parallel.distributed_optimizer
        return sharding if uses_shards and sharding == "dp_reshardable" else None

    def _tick(self) -> None:
        now = time.time()
        self.state.wall_seconds += now - self._clock
        self._clock = now

    def save(self, last: bool = False) -> None:
        """Start a checkpoint of this step (in the background unless train.async_save=false);
        `last`: the run's last save, never skipped for lack of space."""
        progress.phase("save")
        self._tick()
        sync = getattr(self.optimizer, "sync_params", None)
        if sync:  # weights whose all-gather overlaps the next forward: complete them first
            sync()
        self.state.scheduler = self.scheduler.state_dict()
        state = {
            "step": self.state.step,
            "val_loss": self.state.val_loss,
            "layout": {**self.parallel_layout(), "optimizer_sharding": self._optimizer_sharding()},
            "made_from": self.made_from,
            "run": dict(vars(self.state)),  # as it is now: training goes on while it is written
        }
        self._saved(self.saver.save(self.state.step, state, self.chunks, self.optimizer, last))

    def _complete_checkpoint(self) -> None:
        """At a step's end: a checkpoint written in the background meanwhile is completed."""
        self._saved(self.saver.poll())

    def _saved(self, record: dict | None) -> None:
        """A checkpoint that is now complete: its times into the metrics and the log."""
        if record is None:
            return
        progress.save_took(record["checkpoint_total_s"])
        self.metrics.record(record)
        self.scoring.saved(record["step"])  # eval.harness_every: its own job, not waited for
        _log.info(
            f"checkpoint of step {record['step']} complete: training waited "
            f"{record['checkpoint_blocked_s']:.2f} s, the save took "
            f"{record['checkpoint_total_s']:.2f} s"
        )

    # --- logging ------------------------------------------------------------------------------

    def _record_placement(self) -> None:
        """train/ranks.json: for each attempt, the step it started from and where each rank ran."""
        ranks = self.placement()
        log.get("train").info(f"{placement.describe(ranks)}")
        kernels = self.backend.kernels(self.cfg)
        log.get("train").info(f"kernels: {kernels}")
        if moe.is_moe(self.cfg.model):  # FLOPs, TFLOP/s and MFU count the active ones
            log.get("train").info(
                f"parameters: {self.parameters:,}, {self.active_parameters:,} active per token "
                "(TFLOP/s and MFU count the active ones)"
            )
        self.metrics.record({"step": self.state.step, "kernels": kernels})
        if self.cfg.train.auto_choice:
            log.get("train").info(f"{self.cfg.train.auto_choice}")
        if self.rank.is_first:
            record = files.read_json_or_none(self.paths.ranks) or {"attempts": []}
            record["attempts"].append({"from_step": self.state.step, "ranks": ranks})
            files.write_json(self.paths.ranks, record)

    def _router_interval(self, steps: int) -> dict:
        """MoE router health and auxiliary losses over the last `steps` steps ({}: dense)."""
        if self.router_health is None:
            return {}
        record, _ = self.router_health.interval(steps * self.cfg.train.grad_accum)
        return record

    def _warn_of_collapse(self, record: dict) -> None:
        for layer, problem in record.get("moe_collapse", {}).items():
            _log.warning(warning_line(record["step"], int(layer), problem, self.cfg.model))

    def _throughput(self) -> Throughput:
        cfg, t = self.cfg, self.cfg.train
        per_sequence = flops.flops_per_sequence(cfg.model, self.vocab_size, self.settled.tensor)
        on_cuda = self.device.type == "cuda"
        return Throughput(
            tokens_per_step=t.global_batch_size * cfg.model.seq_length,
            flops_per_step=per_sequence * t.global_batch_size,
            ranks=self.rank.world_size,
            peak_tflops=peak_tflops(
                torch.cuda.get_device_name() if on_cuda else "cpu", t.precision
            ),
            on_cuda=on_cuda,
        )

    # --- the loop -----------------------------------------------------------------------------

    def fit(self) -> TrainRecord | Interrupted:
        cfg, t = self.cfg, self.cfg.train
        self.paths.train_dir.mkdir(parents=True, exist_ok=True)
        self.resume()
        if t.async_save and t.save_interval > 0:
            self.saver.reserve(self._staged_bytes())
        self._record_placement()
        self.metrics.keep_until(self.state.step)
        train_ds = datasets.train_dataset(cfg, self.manifest)
        # the same sequences at every validation, whole micro-batches on every rank
        micro = self.settled.micro_batch_size
        validation = evalsets.validation_sets(cfg, self.manifest, micro * self.dp_size)
        # before the data-loading workers fork: they inherit the handlers, and a job signal
        # (time-limit warning, preemption) reaches them too, which would otherwise kill them
        stop = StopRequest()
        iterators = self.iterators(train_ds, self.state.consumed_samples, micro)
        iterators = [progress.reporting(batches) for batches in iterators]
        self.metrics.open_tensorboard(self.state.step)
        hooks = step_hooks(
            cfg, self.device, self.paths.profile, self.is_logger, stop, self._complete_checkpoint
        )
        window_seconds, window_steps = 0.0, 0
        tokens_per_step = t.global_batch_size * cfg.model.seq_length
        while self.state.step < t.steps:
            hooks.before(self.state.step + 1)
            started = time.time()
            with hooks.during():
                loss, grad_norm, updated = self.iteration(iterators)  # reading the loss syncs
            took = time.time() - started
            window_seconds += took
            st = self.state
            st.step += 1
            hooks.after(st.step, took)
            st.consumed_samples += t.global_batch_size
            st.tokens += tokens_per_step
            if updated:
                st.skipped_in_a_row = 0
            else:
                st.skipped_steps += 1
                self._skipped_update(loss, grad_norm)
            if math.isfinite(loss):
                if st.first_train_loss is None:
                    st.first_train_loss = loss
                st.last_train_loss = loss
            window_steps += 1
            if st.step % t.log_interval == 0 or st.step == t.steps:
                st.train_seconds += window_seconds
                record = {
                    "step": st.step,
                    "tokens": st.tokens,
                    "loss": loss,
                    "grad_norm": grad_norm,
                    "lr": self.optimizer.param_groups[0]["lr"],
                    "skipped_steps": st.skipped_steps,
                    **self.throughput.over(window_steps, window_seconds),
                    **hooks.interval(st.step, window_seconds),
                    **self._router_interval(window_steps),
                }
                self.metrics.record(record)
                _log.info(console_line(record, t.steps))
                self._warn_of_collapse(record)
                window_seconds, window_steps = 0.0, 0
            due_save = t.save_interval > 0 and (
                st.step % t.save_interval == 0 or st.step == t.steps
            )
            st.val_loss = None  # the validation loss at this very step, if validated
            if due_save or st.step % t.eval_interval == 0 or st.step == t.steps:
                self.validate(validation)
            stopping = hooks.wants_stop()
            if due_save or stopping:
                self.save(last=stopping or st.step == t.steps)
            if stopping:
                progress.phase("save")
                self._saved(self.saver.wait(last=True))
                self.saver.close()
                self.scoring.finish()
                self.metrics.close()
                requeue = stop.continues(self.device)
                signals = ", ".join(signal.Signals(s).name for s in sorted(stop.received))
                leaving = "exiting for requeue" if requeue else "exiting"
                _log.info(
                    f"{signals or 'a signal on another rank'}: saved step {st.step}, {leaving}"
                )
                return Interrupted(st.step, requeue)
        progress.phase("finish")
        self._saved(self.saver.wait(last=True))
        self.saver.close()
        self.scoring.finish()
        result = self._finish()
        self.metrics.close(finished=self.rank.is_first)  # the report, where _finish wrote it
        stop.ignore_warnings()
        return result

    def validate(self, validation: dict[str, evalsets.Windows]) -> None:
        """The validation loss of each source and of the mixture (weighted as training samples
        them), which decides the best checkpoint."""
        progress.phase("validate")
        st, mbs = self.state, self.settled.micro_batch_size
        losses = {name: self.loss_over(w, mbs, None)[0] for name, w in validation.items()}
        st.val_loss = evalsets.mixture_loss(losses, self.cfg)
        if st.best_val_loss is None or st.val_loss < st.best_val_loss:
            st.best_val_loss = st.val_loss
        by_source = {f"val_loss/{name}": loss for name, loss in losses.items()}
        many = len(losses) > 1
        record = {"step": st.step, "tokens": st.tokens, "val_loss": st.val_loss}
        self.metrics.record({**record, **(by_source if many else {})})
        each = ", ".join(f"{name} {loss:.4f}" for name, loss in losses.items())
        _log.info(
            f"step {st.step}: validation loss {st.val_loss:.4f}" + (f" ({each})" if many else "")
        )

    def _finish(self) -> TrainRecord:
        self._tick()
        st, t, m = self.state, self.cfg.train, self.cfg.model
        gpus = self.rank.world_size if self.device.type == "cuda" else 0
        checkpoint.require_finite(self.chunks, st.step)  # never mark diverged weights complete
        best = checkpoint.best(self.paths.checkpoints, checksums=False)  # evaluation verifies it
        best_record = files.read_json_or_none(self.paths.checkpoints / checkpoint.BEST) or {}
        result: TrainRecord = {
            "made_from": self.made_from,
            "fingerprint": provenance.fingerprint(self.made_from),
            "status": "complete",
            "train_steps": st.step,
            "tokens": self.manifest["total"]["split_tokens"]["train"],
            "source_weights": sources.weights(self.cfg.data),
            "trained_tokens": st.tokens,
            "vocab_size": self.manifest["vocab_size"],
            "first_train_loss": st.first_train_loss,
            "last_train_loss": st.last_train_loss,
            "best_val_loss": best_record.get("val_loss", st.best_val_loss),
            "skipped_steps": st.skipped_steps,
            "tokens_per_s": st.step
            * t.global_batch_size
            * m.seq_length
            / max(st.train_seconds, 1e-9),
            "parameters": self.parameters,
            "active_parameters": self.active_parameters,
            "best_checkpoint": str(best) if best else None,
            "wall_seconds": st.wall_seconds,
            "gpus": gpus,
            "gpu_hours": gpus * st.wall_seconds / 3600,
        }
        if self.rank.is_first:
            files.write_json(self.paths.train_done, result)
            write_report(self.paths)  # and summary.json; an earlier evaluation only if current
        return result
