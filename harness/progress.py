"""A progress bar for one run: ``run(cfg, quiet)`` is ``launcher.run`` with the
bar drawn from the launcher's per-step progress callback."""

from __future__ import annotations

from .launcher import run as launch


def run(cfg, quiet: bool = False):
    """Run ``cfg`` and return its record; unless ``quiet``, show steps done and the latest values."""
    if quiet:
        return launch(cfg)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), transient=True) as prog:
        task = prog.add_task(f"{cfg.algorithm} w{cfg.world_size} {cfg.backend}", total=cfg.steps, info="")

        def progress(step, values):
            info = " ".join(f"{k}={v:.4g}" for k, v in values.items())
            prog.update(task, completed=step, info=info)

        return launch(cfg, progress=progress)
