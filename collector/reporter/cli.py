"""Client commands for batch scripts: ``collector report``, ``collector stream-logs``, ``collector wrap``.

Reporting is fire-and-forget: a command that could not reach an endpoint warns on stderr and
still exits 0 (``report --strict`` exits 1), so a script under ``set -e`` never dies of it, and
``wrap`` always exits with its command's code. Only a usage error (no endpoint, no job id) fails.
"""

from __future__ import annotations

import json
import os
import signal
import threading

import click

from collector.reporter.client import Client
from collector.reporter.client import client_options
from collector.reporter.client import unacknowledged
from collector.reporter.status import STAGES
from collector.reporter.status import STATUSES
from collector.reporter.wrap import SIGNAL_GRACE
from collector.reporter.wrap import run as wrap_command


def _done(acknowledged: bool, what: str, strict: bool = False) -> None:
    if not acknowledged:
        unacknowledged(what)
        if strict:
            raise SystemExit(1)


strict_option = click.option("--strict", is_flag=True, help="Exit 1 when an endpoint did not acknowledge.")


@click.group()
def report() -> None:
    """Report a job's lifecycle: submit, status, started, completed."""


@report.command()
@client_options
@strict_option
@click.option("--job-name", default=None, help="Job name (default: $SLURM_JOB_NAME, else the job id).")
@click.option("--recipe", default=None, help="Recipe or script path to record.")
@click.option("--metadata", default=None, metavar="JSON", help="Metadata object, as JSON.")
def submit(client: Client, strict: bool, job_name: str | None, recipe: str | None, metadata: str | None) -> None:
    """Register the job (POST /api/jobs), e.g. on the login node right after sbatch."""
    try:
        extra = json.loads(metadata) if metadata else None
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--metadata") from None
    if extra is not None and not isinstance(extra, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--metadata")
    name = job_name or os.environ.get("SLURM_JOB_NAME") or client.job_id
    _done(client.reporter().create(name, recipe=recipe, metadata=extra), "submit", strict)


@report.command()
@client_options
@strict_option
@click.argument("status", type=click.Choice(STATUSES))
@click.option("--stage", type=click.Choice(STAGES), default=None, help="Stage being entered.")
@click.option("--message", default=None, help="Free text shown with the status.")
def status(client: Client, strict: bool, status: str, stage: str | None, message: str | None) -> None:
    """Report STATUS, the stage the job is entering (completed and failed end it)."""
    _done(client.reporter().report(status, stage, message), "status", strict)


@report.command()
@client_options
@strict_option
@click.option("--job-name", default=None, help="Job name (default: $SLURM_JOB_NAME).")
@click.option("--head-node", default=None, help="Head node (default: this host's name).")
@click.option("--log-dir", default=None, help="The run's log directory on the cluster filesystem.")
def started(client: Client, strict: bool, job_name: str | None, head_node: str | None, log_dir: str | None) -> None:
    """Report starting/starting "Job started on <head>" with started_at and the job's identity."""
    acknowledged = client.reporter().report_started(
        job_name=job_name or os.environ.get("SLURM_JOB_NAME"), head_node=head_node,
        log_dir=os.path.abspath(log_dir) if log_dir else None)
    _done(acknowledged, "started", strict)


@report.command()
@client_options
@strict_option
@click.option("--exit-code", type=int, required=True, help="The job's exit code: 0 completed, else failed.")
@click.option("--logs-url", default=None, help="Where the logs were uploaded.")
def completed(client: Client, strict: bool, exit_code: int, logs_url: str | None) -> None:
    """Report completed (exit code 0) or failed "Job failed with exit code N"."""
    _done(client.reporter().report_completed(exit_code, logs_url=logs_url), "completed", strict)


interval_option = click.option("--interval", type=click.FloatRange(min=0.05), default=10.0, show_default=True,
                               help="Seconds between uploads.")
outbox_option = click.option("--outbox", type=click.Path(file_okay=False), default=None,
                             help="Directory of sealed *.parquet capture segments to upload and then delete.")


@click.command("stream-logs")
@client_options
@interval_option
@outbox_option
@click.argument("directory", type=click.Path(file_okay=False))
def stream_logs(client: Client, interval: float, outbox: str | None, directory: str) -> None:
    """Stream new bytes of DIRECTORY's log files until SIGTERM or SIGINT, then flush once more (at most 5 s)."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    streamer = client.streamer(directory, outbox, interval).start()
    while not stopping.wait(1.0):
        pass
    _done(streamer.stop(), "the final log flush")


# The command and its arguments go after "--"; options after it belong to the command.
@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@client_options
@interval_option
@outbox_option
@click.option("--log-dir", type=click.Path(file_okay=False), default=None,
              help="Also stream this directory; the command's output goes to wrap-<job id>.out in it.")
@click.option("--job-name", default=None, help="Job name (default: $SLURM_JOB_NAME).")
@click.option("--signal-grace", type=click.FloatRange(min=0), default=SIGNAL_GRACE, show_default=True,
              metavar="SECONDS", help="After forwarding SIGTERM/SIGINT, kill the command if it is still running.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def wrap(client: Client, interval: float, outbox: str | None, log_dir: str | None, job_name: str | None,
         signal_grace: float, command: tuple[str, ...]) -> None:
    """Run COMMAND with the whole lifecycle reported: started, its output streamed, completed or failed."""
    raise SystemExit(wrap_command(client, list(command), log_dir=log_dir, outbox=outbox, interval=interval,
                         job_name=job_name or os.environ.get("SLURM_JOB_NAME"), signal_grace=signal_grace))

