"""What every client command shares: its options, and the Client they build."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from typing import Any
from typing import TypeVar

import click

from collector.reporter.status import StatusReporter
from collector.reporter.streamer import LogStreamer
from collector.reporter.transport import DEFAULT_TOKEN_ENV
from collector.reporter.transport import ENDPOINTS_ENV
from collector.reporter.transport import Transport
from collector.reporter.transport import env_endpoints
from collector.reporter.transport import env_token

T = TypeVar("T")

@dataclasses.dataclass
class Client:
    """What every client command was given: where to report, for which job, with which token."""

    endpoints: list[str]
    token: str | None
    job_id: str
    cluster: str | None
    timeout: float

    def transport(self, *, session: bool = True) -> Transport:
        """A new transport to every endpoint."""
        return Transport(self.endpoints, self.token, timeout=self.timeout, session=session)

    def reporter(self) -> StatusReporter:
        """A status reporter for this job."""
        return StatusReporter(self.transport(session=False), self.job_id, cluster=self.cluster)

    def streamer(self, log_dir: str | None, outbox: str | None, interval: float) -> LogStreamer:
        """A log streamer (not yet started) for this job."""
        return LogStreamer(self.transport(), self.job_id, log_dir, cluster=self.cluster, interval=interval,
                           outbox=outbox)


def client_options(command: Callable[..., T]) -> Callable[..., T]:
    """The options every client command takes; the command receives a ``client`` argument."""
    @click.option("--endpoint", "endpoints", multiple=True, metavar="URL",
                  help=f"Collector base URL; repeatable, each gets everything (default: ${ENDPOINTS_ENV}, "
                       "comma-separated).")
    @click.option("--cluster", default=None, help="Cluster name (default: $SLURM_CLUSTER_NAME).")
    @click.option("--job-id", default=None, help="Job id (default: $SLURM_JOB_ID).")
    @click.option("--token-env", default=DEFAULT_TOKEN_ENV, show_default=True, metavar="VAR",
                  help="Variable holding the write token (sent as Authorization: Bearer when set).")
    @click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True, hidden=True,
                  help="Seconds per request attempt.")
    @click.option("-v", "--verbose", is_flag=True, help="Also log every failed request (DEBUG).")
    @functools.wraps(command)
    def wrapper(endpoints: tuple[str, ...], cluster: str | None, job_id: str | None, token_env: str, timeout: float,
                verbose: bool, **kwargs: Any) -> T:
        logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                            format="collector: %(levelname)s %(message)s")
        # urllib3 logs every connection at DEBUG; only ours matter here.
        logging.getLogger("urllib3").setLevel(logging.WARNING)
        found = env_endpoints(endpoints)
        if not found:
            raise click.UsageError(f"no collector endpoint: pass --endpoint URL or set {ENDPOINTS_ENV}")
        job_id = job_id or os.environ.get("SLURM_JOB_ID")
        if not job_id:
            raise click.UsageError("no job id: pass --job-id or run inside a Slurm job (SLURM_JOB_ID)")
        client = Client(found, env_token(token_env), job_id, cluster or os.environ.get("SLURM_CLUSTER_NAME") or None,
                        timeout)
        return command(client=client, **kwargs)
    return wrapper


def unacknowledged(what: str) -> None:
    """Say on stderr that a report did not reach every endpoint (the job goes on)."""
    click.echo(f"collector: {what} was not acknowledged by every endpoint (-v shows why)", err=True)
