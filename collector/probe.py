"""``collector probe``: report a Slurm cluster's nodes, partitions and watched jobs to the collector.

Each cycle runs ``sinfo`` (and ``squeue`` for the "watch" ids, the jobs the collector believes
active on the cluster) through :mod:`collector.slurm` and sends the result to
``PUT /api/clusters/{cluster}/status`` on every endpoint; the collector derives the status and
answers with the next "watch". The first cycle reads "watch" from
``GET /api/clusters/{cluster}/status``, so a restarted probe asks about the right jobs at once.
With several endpoints the watch is the union of their answers: each collector is told about
every id, and ignores the ones it does not hold.

Runs as a command (``--interval 30`` or ``--once`` for a systemd timer) or on a thread inside
``collector serve --probe-cluster NAME`` (:func:`start_in_process`). It never raises out of a
cycle: a probe that cannot run Slurm reports that as the cluster's error, and one that cannot
reach a collector tries again next cycle.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import urllib.parse
from collections.abc import Callable
from collections.abc import Mapping

import click

from collector import slurm
from collector.reporter.status import now
from collector.reporter.transport import DEFAULT_TOKEN_ENV
from collector.reporter.transport import ENDPOINTS_ENV
from collector.reporter.transport import Outcome
from collector.reporter.transport import Transport
from collector.reporter.transport import env_endpoints
from collector.reporter.transport import env_token

log = logging.getLogger("collector.probe")

DEFAULT_INTERVAL_S = 30.0
# slurm.collect, or a stand-in: the watched ids in, the report's Slurm fields out.
Collect = Callable[[list[str]], Mapping[str, object]]


def status_path(cluster: str) -> str:
    """The cluster's status route, its name quoted as one path segment."""
    return f"/api/clusters/{urllib.parse.quote(cluster, safe='')}/status"


def _watch(outcomes: list[Outcome]) -> list[str] | None:
    """The union of the answered "watch" lists, in order; None when no endpoint answered one."""
    answered = [o.body["watch"] for o in outcomes
                if o.ok and o.body and isinstance(o.body.get("watch"), list)]
    if not answered:
        return None
    return list(dict.fromkeys(str(job_id) for ids in answered for job_id in ids))


def learn_watch(cluster: str, transport: Transport) -> list[str]:
    """The job ids the collectors believe active on the cluster ([] when none could say)."""
    return _watch(transport.send("GET", status_path(cluster))) or []


def cycle(cluster: str, transport: Transport, watch: list[str] | None, *,
          interval_s: float = DEFAULT_INTERVAL_S, collect: Collect = slurm.collect) -> tuple[list[str], list[Outcome]]:
    """One probe and report; the next watch and what each endpoint answered to the PUT."""
    if watch is None:
        watch = learn_watch(cluster, transport)
    probed_at = now()  # before sinfo runs: the moment the report describes
    found = collect(watch)
    body = {"probed_at": probed_at, "interval_s": interval_s, **found}
    if body.get("error") is None:
        body.pop("error", None)
    outcomes = transport.send("PUT", status_path(cluster), json=body)
    if not any(o.ok for o in outcomes):
        log.warning("probe of %s reached no collector: %s", cluster,
                    "; ".join(f"{o.endpoint}: {o.error}" for o in outcomes))
    # No answer: keep asking about the same jobs.
    new = _watch(outcomes)
    return (watch if new is None else new), outcomes


def run_once(cluster: str, transport: Transport, watch: list[str] | None, *,
             interval_s: float = DEFAULT_INTERVAL_S, collect: Collect = slurm.collect) -> list[str]:
    """One cycle (``watch`` None: read it from the collector first); returns the watch for the next one."""
    return cycle(cluster, transport, watch, interval_s=interval_s, collect=collect)[0]


def run_forever(cluster: str, transport: Transport, stop: threading.Event, *,
                interval_s: float = DEFAULT_INTERVAL_S, collect: Collect = slurm.collect) -> None:
    """Probe every ``interval_s`` seconds (start to start) until ``stop`` is set."""
    watch = None
    while not stop.is_set():
        started = time.monotonic()
        try:
            watch = run_once(cluster, transport, watch, interval_s=interval_s, collect=collect)
        except Exception:  # noqa: BLE001 - a bug in one cycle must not end the probe
            log.exception("probe cycle for %s failed", cluster)
        stop.wait(max(0.0, interval_s - (time.monotonic() - started)))


class ProbeThread:
    """A probe loop on a daemon thread, for a collector that runs on a login node."""

    def __init__(self, cluster: str, endpoint: str, token: str | None, *,
                 interval_s: float = DEFAULT_INTERVAL_S, collect: Collect = slurm.collect) -> None:
        self.cluster = cluster
        self.transport = Transport([endpoint], token)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=run_forever, name=f"collector-probe-{cluster}", daemon=True,
                                        args=(cluster, self.transport, self._stop),
                                        kwargs={"interval_s": interval_s, "collect": collect})

    def start(self) -> ProbeThread:
        """Start probing (the first cycle at once)."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the current cycle (waits at most ``timeout`` s: a hung sinfo is abandoned)."""
        self._stop.set()
        self._thread.join(timeout)
        self.transport.close()


def start_in_process(cluster: str, url: str, token: str | None, *,
                     interval_s: float = DEFAULT_INTERVAL_S) -> ProbeThread:
    """Probe ``cluster`` on a thread, reporting over HTTP to this collector at ``url`` (its write token)."""
    # Over HTTP rather than into the store: one path for validation, derivation and stream events.
    return ProbeThread(cluster, url, token, interval_s=interval_s).start()


def _summary(cluster: str, outcomes: list[Outcome]) -> str:
    answered = next((o.body for o in outcomes if o.ok and o.body), None)
    if not answered:
        return f"{cluster}: not acknowledged by any endpoint (-v shows why)"
    detail = answered.get("detail")
    return f"{cluster}: {answered.get('status')}" + (f" ({detail})" if detail else "")


@click.command()
@click.option("--cluster", default=None, help="Cluster name as the collector shows it (default: $SLURM_CLUSTER_NAME).")
@click.option("--endpoint", "endpoints", multiple=True, metavar="URL",
              help=f"Collector base URL; repeatable, each gets every report (default: ${ENDPOINTS_ENV}, "
                   "comma-separated).")
@click.option("--token-env", default=DEFAULT_TOKEN_ENV, show_default=True, metavar="VAR",
              help="Variable holding the write token.")
@click.option("--interval", type=click.FloatRange(min=1, max=86_400), default=DEFAULT_INTERVAL_S,
              show_default=True, help="Seconds between probes (also tells the collector when the next is due).")
@click.option("--once", is_flag=True, help="Probe and report once, then exit (for a systemd timer).")
@click.option("-v", "--verbose", is_flag=True, help="Log every cycle and failed request (DEBUG).")
def probe(cluster: str | None, endpoints: tuple[str, ...], token_env: str, interval: float, once: bool,
          verbose: bool) -> None:
    """Report a Slurm cluster's health (sinfo) and watched jobs (squeue) to the collector."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="collector probe: %(levelname)s %(message)s")
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    cluster = (cluster or os.environ.get("SLURM_CLUSTER_NAME") or "").strip()
    if not cluster:
        raise click.UsageError("no cluster name: pass --cluster or set SLURM_CLUSTER_NAME")
    found = env_endpoints(endpoints)
    if not found:
        raise click.UsageError(f"no collector endpoint: pass --endpoint URL or set {ENDPOINTS_ENV}")
    transport = Transport(found, env_token(token_env))
    try:
        if once:
            _, outcomes = cycle(cluster, transport, None, interval_s=interval)
            click.echo(_summary(cluster, outcomes))
            # Non-zero only when no collector took the report: a failed sinfo is a report too.
            raise SystemExit(0 if any(o.ok for o in outcomes) else 1)
        stop = threading.Event()
        # SIGTERM (systemd) ends the loop between cycles like Ctrl-C.
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            run_forever(cluster, transport, stop, interval_s=interval)
    finally:
        transport.close()
