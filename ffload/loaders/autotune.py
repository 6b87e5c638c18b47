"""``num_workers="auto"`` and ``batches_ahead="auto"``: the closed loop that sizes a loader.

:class:`AutoTuner` is a pure object: the epoch iterator feeds it one :class:`Observation` per
job (how long the consumer waited for the job's first batch, how long it worked between two
such waits and how much CPU its own thread used meanwhile, how long the job ran on its worker)
and reads back :attr:`AutoTuner.workers` and :attr:`AutoTuner.ahead`. Nothing in it reads a
clock, so its decisions are tested from made-up observations. A job is one batch, or
``batches_per_job`` consecutive batches (``Loader(batches_per_job=)``); below, "batch" means a
job.

The rules, evaluated once per window of at least :data:`WINDOW` jobs, twice as many as the
workers, and :data:`WINDOW_S` seconds of the consumer's cycles: a window of small batches would
otherwise last a few milliseconds, shorter than one scheduler time slice, and every decision
would follow the noise of whichever thread the kernel ran last. Times are per batch (a job's,
divided by its batches). Step and job times are the window's medians; the consumer's *cycle*
(step + wait), by which every probe is judged, is its mean, the time per batch: a pool's jobs finish in clumps, so the consumer finds most of them
finished and waits long for a few, and a median cycle would not see what a worker count changed:

* **need**: ``ceil(job / step * MARGIN)`` workers produce one batch per consumer step (``job``:
  a batch's time on its worker, ``step``: the consumer's time between two requests; a consumer
  that does nothing but ``next()`` needs every worker the cap allows).
* **headroom**: a consumer thread that uses more than half a core of CPU between its requests
  (``time.thread_time``) in two windows in a row reserves a whole CPU (and gives it back after
  two windows under half a core): the worker cap is the loader's fair share of the
  usable CPUs (:func:`ffload.system.available_cpus`, shared by the live auto loaders of the
  process through :class:`CpuShares`) minus that reserve, at least 1, and at most the batches in
  flight the memory budget allows. The reserve is a first stop, not a wall: a consumer that
  still waits at the cap gets one more worker as a probe (*lending* its CPU: the threads then
  time-share it); kept when the consumer's cycle shortens by :data:`GAIN`, else undone and not
  tried again until the cap or the consumer's step changes. A consumer waiting for its batches
  does not use its core meanwhile, so where the loader is the bottleneck, time-sharing beats
  reserving (a 2-CPU machine: one worker instead of two). Only a loader alone in its
  :class:`CpuShares` lends: the probes of several loaders would change each other's cycles.
* **grow** (one window suffices): the consumer waited more than :data:`WAIT_GROW` of its batch
  period. A shortfall (most batches of the window waited, or the need exceeds the workers):
  workers jump to ``min(cap, max(workers + 1, need))``. Bursts (a few batches waited long):
  the prefetch depth grows by one, as a probe: unless the cycle shortened by :data:`GAIN`, the
  depth goes back and becomes a ceiling. Waits that a deeper queue does not absorb (a noisy
  machine's jitter) would otherwise deepen it batch after batch, and every slot more is buffer
  memory the caches must hold.
* **probe** (while the consumer waits): a grow is a probe; the next judged window compares the
  consumer's cycle: unless it shortened by :data:`GAIN`, the workers go back and that count
  becomes a ceiling (a loader bound by serial work gets slower with more threads). At such a
  ceiling (not at the CPU cap), fewer workers are tried (two thirds); they stay unless the
  cycle lengthens by :data:`GAIN`, else the count comes back and becomes a floor. Ceiling and floor
  are forgotten when the consumer's step changes by half or more.
* **shrink** (two quiet windows in a row, waits under :data:`WAIT_QUIET`): workers above the
  need step down halfway to it; never to a count that made the consumer wait before (reset when
  the consumer's step changes by half or more).
* **settle**: after a grow or a probe, the jobs already queued (``ahead + 1``) are not
  observed: they were submitted, most of them computed, under the old setting, and a window
  of them would judge a probe by the prefetch queue (fewer workers look as fast until it has
  drained), not by the new setting. The window after them is not judged either (new workers
  are still filling their first jobs, a new depth its slots).

Auto prefetch depth is ``workers + extra`` (``extra`` from 2, +1 per burst), at most what the
memory budget allows; a fixed ``batches_ahead`` gives ``max(ceil(batches_ahead /
batches_per_job), workers)`` jobs. Batches do not depend on any of this (per-sample seeds), so the tuner never changes what
a loader yields, only when.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

WINDOW = 8
"""Jobs per decision window, at least (and twice the workers)."""
WINDOW_S = 0.05
"""Seconds per decision window (the consumer's step + wait, summed), at least."""
WARMUP = 2
"""Batches ignored when a loader starts (numba compiling, caches filling)."""
MARGIN = 1.25
"""Workers asked for per worker strictly needed (covers jitter in job times)."""
WAIT_GROW, WAIT_QUIET = 0.05, 0.01
"""Consumer wait, as a fraction of its batch period, above which workers grow / under which a
window counts as quiet."""
GAIN = 0.05
"""A probe's change of workers is kept when the consumer's cycle (step + wait) shortens by this
fraction (more workers) or lengthens by less than it (fewer workers)."""
MIN_WAIT_S = 50e-6
"""Waits shorter than this never count as waiting (the cost of a lock hand-over)."""
EXTRA_START = 2
"""Auto prefetch depth beyond the workers at start."""
JOB_EMA = 0.1
"""Weight of each job in :attr:`AutoTuner.job_seconds_per_batch`, a moving mean over about ten jobs."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """What one job cost, in seconds.

    Attributes:
        wait: the consumer's time blocked in ``next()`` waiting for this batch's job.
        step: the consumer's wall time between its previous ``next()`` returning and this one
            returning, less ``wait`` (its training step plus the loader's own work in
            ``next()``).
        consumer_cpu: the CPU time of the consumer's thread between its previous ``next()``
            returning and this one being called (``time.thread_time``; its training step's).
        job: the job's wall time on its worker (after the worker was admitted).
        batches: the batches the job computed. The tuner compares times per batch: with
            ``num_workers="auto"`` an epoch's job size follows the workers admitted, so a probe
            that spans an epoch boundary would otherwise compare jobs of different sizes.
    """

    wait: float
    step: float
    consumer_cpu: float
    job: float
    batches: int = 1


def fair_shares(total: int, demands: dict) -> dict:
    """Max-min fair split of ``total`` CPUs between loaders: key -> demand (workers wanted, >= 1)
    gives key -> workers granted. The smallest demands are met first, the rest share what is
    left equally; every loader gets at least 1 (more loaders than CPUs oversubscribe)."""
    granted, left = {}, total
    order = sorted(demands, key=lambda k: (demands[k], str(k)))
    for i, key in enumerate(order):
        fair = left // (len(order) - i)
        granted[key] = max(1, min(demands[key], fair))
        left -= granted[key]
    return granted


class CpuShares:
    """The CPUs the auto loaders of one process share (one :data:`PROCESS_SHARES` per process).

    Each tuner joins with a key, then reports its demand and its consumer's reserve (0 or 1 CPU)
    and gets back its worker cap: what is left of ``total``, less every consumer's reserve, once
    the others have their max-min fair shares (:func:`fair_shares`) of what they demand.
    Thread-safe.

    Args:
        total: CPUs to share (``None``: :func:`ffload.system.available_cpus` on first use).
    """

    def __init__(self, total: int | None = None):
        self._total = total
        self._lock = threading.Lock()
        self._members: dict = {}  # key -> (demand, reserve)

    @property
    def total(self) -> int:
        """The CPUs shared."""
        if self._total is None:
            from ffload.system import available_cpus

            self._total = available_cpus()
        return self._total

    def join(self, key, demand: int) -> None:
        """Add a loader wanting ``demand`` workers (no reserve yet)."""
        with self._lock:
            self._members[key] = (max(1, demand), 0)

    def leave(self, key) -> None:
        """Remove a loader (closed): its share goes to the others at their next window."""
        with self._lock:
            self._members.pop(key, None)

    @property
    def members(self) -> int:
        """Auto loaders sharing the CPUs now."""
        with self._lock:
            return len(self._members)

    def update(self, key, demand: int, reserve: int) -> int:
        """Record ``key``'s demand and reserve; its worker cap (>= 1): the most it may take while
        the others keep their fair shares of what they demand."""
        with self._lock:
            self._members[key] = (max(1, demand), reserve)
            free = max(1, self.total - sum(r for _, r in self._members.values()))
            demands = {k: d for k, (d, _) in self._members.items()}
            demands[key] = free
            return fair_shares(free, demands)[key]


PROCESS_SHARES = CpuShares()
"""The CPUs of this process, shared by every auto loader in it."""


class AutoTuner:
    """Chooses a loader's worker count and prefetch depth from per-batch observations (see the
    module docstring for the rules).

    Args:
        max_workers: the most workers ever (the usable CPUs; the pool's size).
        max_ahead: the deepest prefetch the memory budget allows (``>= 0``).
        workers: a fixed worker count, or ``None`` for auto (starts at half of ``max_workers``).
        batches_ahead: a fixed prefetch depth, or ``None`` for auto.
        shares: the :class:`CpuShares` the loader draws from (``None``: one of its own, of
            ``max_workers`` CPUs).
        name: how log lines name the loader.
        batches_per_job: the batches one job computes (``Loader(batches_per_job=)``). The tuner
            works in jobs: one observation per job, ``max_ahead`` and :attr:`ahead` in jobs, a
            fixed ``batches_ahead`` rounded up to whole jobs; :meth:`stats` and :meth:`state`
            report batches.

    Attributes:
        workers: worker threads admitted to run jobs now.
        ahead: jobs kept queued beyond the one being consumed (``slots = ahead + 2``).
        job_seconds_per_batch: the jobs' wall time on their workers per batch, a moving mean
            (:data:`JOB_EMA`) over every observation, the warm-up's too, whether or not anything is
            auto; ``None`` before the first. The loader sizes an epoch's jobs from it
            (:func:`ffload.loaders.loader._job_size_rule`).
        history: ``[{'batch', 'from_workers', 'workers', 'ahead', 'reason'}]``, one entry per
            change (``batch``: the observation it followed; ``ahead`` in batches).
    """

    def __init__(
        self,
        max_workers: int,
        max_ahead: int,
        workers: int | None = None,
        batches_ahead: int | None = None,
        shares: CpuShares | None = None,
        name: str = "loader",
        batches_per_job: int = 1,
    ):
        self.max_workers, self.max_ahead, self.name = max(1, max_workers), max(0, max_ahead), name
        self.auto_workers, self.auto_ahead = workers is None, batches_ahead is None
        self._batches_ahead = batches_ahead
        self.set_batches_per_job(batches_per_job)
        self.shares = CpuShares(self.max_workers) if shares is None else shares
        self.workers = min(self.max_workers, (self.max_workers + 1) // 2 if workers is None else workers)
        self._extra = EXTRA_START
        self.cap = self.max_workers
        self.reserve, self.need = 0, self.workers
        self._reserve_votes = 0
        self._window: list[Observation] = []
        self._window_s = 0.0  # the current window's seconds
        self._seen = 0
        self.job_seconds_per_batch: float | None = None
        self._quiet = 0
        self._settle = 0  # observations to drop before the next window (jobs queued before a change)
        self._judge_later = False  # the first window after them is not judged either
        self._too_few: tuple[int, float] | None = None  # (workers that made the consumer wait, step then)
        self._ceiling: tuple[int, float] | None = None  # (workers beyond which the cycle did not shorten, step)
        self._probe: tuple[str, int, float] | None = None  # ('up' | 'down', workers before, cycle before)
        self._lent: float | None = None  # the step when a probe into the consumer's reserved CPU was kept
        self._kept: tuple[int, float] | None = None  # (cap, step) when such a probe was undone
        self._deepest: tuple[int, float] | None = None  # (extra beyond which depth did not help, step)
        self._last: dict | None = None
        self.history: list[dict] = []
        if self.auto_workers:
            self.shares.join(id(self), self.max_workers)

    def set_batches_per_job(self, batches_per_job: int) -> None:
        """The batches each job computes from now on (an auto job size changes per epoch): a
        fixed ``batches_ahead`` is rounded up to whole jobs of this size, at most ``max_ahead``
        jobs (the slots there are)."""
        self.batches_per_job = per_job = max(1, batches_per_job)
        fixed = self._batches_ahead
        self._fixed_ahead = None if fixed is None else min(-(-fixed // per_job), max(self.max_ahead, 1))

    @property
    def ahead(self) -> int:
        """Jobs queued beyond the one being consumed."""
        if self.auto_ahead:
            return min(self.max_ahead, self.workers + self._extra)
        return max(self._fixed_ahead, self.workers)

    def close(self) -> None:
        """Leave the CPU shares (the loader is closed)."""
        self.shares.leave(id(self))

    def observe(self, obs: Observation) -> str | None:
        """Take one job's observation; the reason when the workers or the depth changed."""
        self._seen += 1
        per_batch, mean = obs.job / max(1, obs.batches), self.job_seconds_per_batch
        self.job_seconds_per_batch = per_batch if mean is None else mean + JOB_EMA * (per_batch - mean)
        if self._seen <= WARMUP or not (self.auto_workers or self.auto_ahead):
            return None
        if self._settle:
            self._settle -= 1
            return None
        self._window.append(obs)
        self._window_s += obs.step + obs.wait
        if len(self._window) < max(WINDOW, 2 * self.workers) or self._window_s < WINDOW_S:
            return None
        self._window_s = 0.0
        window, self._window = self._window, []
        return self._decide(window)

    def _decide(self, window: list[Observation]) -> str | None:
        batches = sum(o.batches for o in window)  # times below are per batch
        step = statistics.median(o.step / o.batches for o in window)
        job = statistics.median(o.job / o.batches for o in window)
        wait = sum(o.wait for o in window) / batches
        waited = sum(o.wait > MIN_WAIT_S for o in window) / len(window)
        cpu = statistics.median(o.consumer_cpu / o.step if o.step > 0 else 0.0 for o in window)
        period = step + wait
        if int(cpu > 0.5) != self.reserve:  # two windows in a row change it (a pause is not a trend)
            self._reserve_votes += 1
            if self._reserve_votes >= 2:
                self.reserve, self._reserve_votes, self._lent, self._kept = 1 - self.reserve, 0, None, None
        else:
            self._reserve_votes = 0
        self.need = self.max_workers if step <= 0 else max(1, math.ceil(job / step * MARGIN))
        self._last = {"step_ms": step * 1e3, "wait_ms": wait * 1e3, "job_ms": job * 1e3, "consumer_cpu": cpu}
        cap = lend = self.max_workers
        if self.auto_workers:
            share = self.shares.update(id(self), min(self.need, self.max_workers), self.reserve)
            flight = self.max_ahead + 1  # more workers than batches in flight idle
            cap = max(1, min(self.max_workers, share, flight))
            if self.shares.members == 1:  # alone: several loaders' probes would confound each other's cycles
                lend = max(1, min(self.max_workers, share + self.reserve, flight))  # the reserved CPU lent
            else:
                lend = cap
        self.cap = cap
        if self._judge_later:
            self._judge_later = False
            return None
        waiting = wait > MIN_WAIT_S and wait > WAIT_GROW * period
        quiet = wait <= MIN_WAIT_S or wait <= WAIT_QUIET * period
        cycle = sum(o.step for o in window) / batches + wait  # the window's time per batch
        for bound in ("_too_few", "_ceiling", "_deepest"):
            known = getattr(self, bound)
            if known is not None and abs(step - known[1]) > 0.5 * known[1]:
                setattr(self, bound, None)  # the consumer changed: what was learnt may not hold
        if self._lent is not None and abs(step - self._lent) > 0.5 * self._lent:
            self._lent = None
        if self._kept is not None and (self._kept[0] != cap or abs(step - self._kept[1]) > 0.5 * self._kept[1]):
            self._kept = None  # another cap (loaders came or went) or another consumer: lending may pay now
        probe, self._probe = self._probe, None
        into_reserve = probe is not None and probe[0] == "up" and probe[1] >= cap
        if into_reserve and cycle <= probe[2] * (1 - GAIN):
            self._lent = step  # the probe into the reserve paid: keep the CPU lent
        limit = lend if self._lent is not None else cap
        workers, extra, reason = self.workers, self._extra, None
        floor = self._too_few[0] + 1 if self._too_few is not None else 1
        if into_reserve and self._lent is None:
            self._kept = (cap, step)
            workers, reason = min(probe[1], limit), "lending the consumer's CPU did not shorten its cycle"
        elif self.auto_workers and workers > limit:
            workers, reason = limit, "headroom for the consumer and other loaders"
        elif probe is not None and probe[0] == "up" and cycle > probe[2] * (1 - GAIN):
            self._ceiling = (probe[1], step)
            workers, reason = probe[1], "more workers did not shorten the consumer's cycle"
        elif probe is not None and probe[0] == "down" and cycle > probe[2] * (1 + GAIN):
            self._too_few = (workers, step)
            workers, reason = probe[1], "fewer workers lengthened the consumer's cycle"
        elif probe is not None and probe[0] == "deeper" and cycle > probe[2] * (1 - GAIN):
            self._deepest = (probe[1], step)
            extra, reason = probe[1], "a deeper prefetch did not shorten the consumer's cycle"
        elif waiting:
            self._quiet = 0
            if probe is not None and probe[0] == "down":
                self._ceiling = (workers, step)  # as fast with fewer: stay at most here
            shortfall = waited >= 0.5 or self.need > workers
            top = cap if self._ceiling is None else min(cap, self._ceiling[0])
            lendable = self._kept is None and (self._ceiling is None or self._ceiling[0] > workers)
            deeper = self._deepest is None or extra < self._deepest[0]
            if shortfall and self.auto_workers and workers < top:
                if self.history and self.history[-1]["workers"] < self.history[-1]["from_workers"]:
                    self._too_few = (workers, step)
                self._probe = ("up", workers, cycle)
                workers, reason = min(top, max(workers + 1, self.need)), "the consumer waited"
            elif shortfall and self.auto_workers and cap <= workers < lend and lendable:
                self._probe = ("up", workers, cycle)
                workers, reason = workers + 1, "the consumer waited: trying its reserved CPU"
            elif shortfall and self.auto_workers and workers > floor and top < cap and workers >= top:
                self._probe = ("down", workers, cycle)
                workers, reason = max(floor, min(workers - 1, workers * 2 // 3)), "trying fewer workers (no gain above)"
            elif not shortfall and self.auto_ahead and self.ahead < self.max_ahead and deeper:
                self._probe = ("deeper", extra, cycle)
                extra, reason = extra + 1, "the consumer waited in bursts"
        elif quiet and self.auto_workers and self.need < workers:
            self._quiet += 1
            target = max(self.need, floor, workers - max(1, (workers - self.need) // 2))
            if self._quiet >= 2 and target < workers:
                workers, reason = target, "the consumer never waited"
        else:
            self._quiet = 0
        if reason is None:
            return None
        self._quiet = 0
        if workers > self.workers or extra > self._extra or self._probe is not None:
            self._settle, self._judge_later = self.ahead + 1, True  # the jobs queued now ran under the old setting
        from_workers = self.workers
        self.workers, self._extra = workers, extra
        self.history.append(
            {
                "batch": self._seen,
                "from_workers": from_workers,
                "workers": self.workers,
                "ahead": self.ahead * self.batches_per_job,
                "reason": reason,
            }
        )
        logger.info(
            "%s: num_workers %d -> %d, batches_ahead %d (%s; step %.2f ms, wait %.2f ms, job %.2f ms, "
            "consumer CPU %.0f%%, cap %d)",
            self.name,
            from_workers,
            self.workers,
            self.ahead * self.batches_per_job,
            reason,
            step * 1e3,
            wait * 1e3,
            job * 1e3,
            cpu * 100,
            cap,
        )
        return reason

    def stats(self) -> dict:
        """``{'num_workers', 'batches_ahead', 'batches_per_job', 'auto_workers', 'auto_ahead',
        'max_workers', 'max_ahead', 'cap', 'reserve', 'need', 'batches_observed', 'last_window',
        'history'}``: the choices and the medians they were made from (``batches_ahead`` and
        ``max_ahead`` in batches; ``batches_observed`` and ``need`` count jobs; ``last_window``:
        ``step_ms``, ``wait_ms`` (a mean), ``job_ms`` per batch, ``consumer_cpu`` as a fraction of a core,
        or ``None`` before the first window)."""
        return {
            "num_workers": self.workers,
            "batches_ahead": self.ahead * self.batches_per_job,
            "batches_per_job": self.batches_per_job,
            "auto_workers": self.auto_workers,
            "auto_ahead": self.auto_ahead,
            "max_workers": self.max_workers,
            "max_ahead": self.max_ahead * self.batches_per_job,
            "cap": self.cap,
            "reserve": self.reserve,
            "need": self.need,
            "batches_observed": self._seen,
            "last_window": None if self._last is None else dict(self._last),
            "history": [dict(h) for h in self.history],
        }

    def state(self) -> dict[str, int]:
        """The choices to resume from: ``{'num_workers', 'batches_ahead'}`` (in batches)."""
        return {"num_workers": self.workers, "batches_ahead": self.ahead * self.batches_per_job}

    def restore(self, state: dict, job_size: Callable[[int], int] | None = None) -> None:
        """Start from saved choices (:meth:`state`), clamped to this tuner's bounds; fixed
        settings stay as given. ``job_size``: the batches per job the restored workers will run
        (a function of the worker count; ``None``: the current ``batches_per_job``), in whose
        jobs the saved depth is counted."""
        if self.auto_workers:
            self.workers = max(1, min(self.max_workers, int(state["num_workers"])))
        if job_size is not None:
            self.set_batches_per_job(job_size(self.workers))
        if self.auto_ahead:
            self._extra = max(0, -(-int(state["batches_ahead"]) // self.batches_per_job) - self.workers)
