"""The `ftw` command: convert, inspect, verify, check.

Commands are thin: they parse options, call the library, and render what it returns as a
rich table or, with --json, as JSON on stdout. Any FtwError ends the command with one line
on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import (
    BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from ftw.errors import FtwError
from ftw.layer_ranges import format_layers, parse_layers

out = Console()
if not out.is_terminal:
    out = Console(width=160)  # piped output: wide tables rather than wrapped cells
err = Console(stderr=True)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@contextmanager
def progress_bar(total: int, description: str, quiet: bool):
    """Yields advance(nbytes, layers=0); shows bytes, speed, layers and ETA on stderr."""
    if quiet or not err.is_terminal:
        yield lambda n=0, layers=0: None
        return
    bar = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
        DownloadColumn(), TransferSpeedColumn(), TextColumn("{task.fields[layers]}"),
        TimeRemainingColumn(), console=err, transient=True,
    )
    with bar:
        task = bar.add_task(description, total=total, layers="")
        done = {"layers": 0}

        def advance(n: int = 0, layers: int = 0, total_layers: int | None = None) -> None:
            done["layers"] += layers
            fields = {"layers": f"layer {done['layers']}/{total_layers}"} if total_layers else {}
            bar.update(task, advance=n, **fields)

        yield advance


def emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ftw")
def cli() -> None:
    """Convert MoE checkpoints into FTW containers of per-layer expert banks."""


# -- inspect ------------------------------------------------------------------------------
@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--layers", help="Only these MoE layers, e.g. 0-3,10.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (every blob's offset, size, dtype, shape, codec).")
def inspect(file: str, layers: str | None, as_json: bool) -> None:
    """Summarize an FTW file from its index alone (no data is read)."""
    import ftw
    from ftw.summary import summarize

    with ftw.open(file) as f:
        s = summarize(f, parse_layers(layers))
    if as_json:
        emit_json(s)
        return
    render_summary(s)


def render_summary(s: dict) -> None:
    m = s["model"] or {}
    prov = s["provenance"]
    out.print(f"[bold]{s['file']}[/]  FTW v{s['version'][0]}.{s['version'][1]}, {human(s['file_nbytes'])}")
    if prov:
        out.print(f"  from {prov.get('reader', '?')}: {prov.get('source', '?')} (ftw {prov.get('tool_version', '?')})")
    if m:
        out.print(
            f"  model [cyan]{m['family']}[/]: H={m['hidden_size']} I={m['moe_intermediate_size']} "
            f"E={m['num_experts']} top_k={m['top_k']} layers={m['num_layers']} "
            f"MoE layers={format_layers(m['moe_layers'])} activation={m['activation']}"
        )
    t = Table(title="Layer formats", title_justify="left")
    for c in ("format", "options", "layers", "count", "expert bytes"):
        t.add_column(c, justify="right" if c in ("count", "expert bytes") else "left")
    for f in s["formats"]:
        t.add_row(f["name"], json.dumps(f["options"]) if f["options"] else "", format_layers(f["layers"]),
                  str(len(f["layers"])), human(f["raw_nbytes"]))
    out.print(t)
    t = Table(title="Banks", title_justify="left")
    for c in ("layer", "format", "bank", "dtype", "shape", "per expert", "total", "codec", "ratio"):
        t.add_column(c, justify="right" if c in ("per expert", "total", "ratio", "layer") else "left", no_wrap=True)
    for row in s["layers"]:
        for i, b in enumerate(row["banks"]):
            t.add_row(
                str(row["layer"]) if i == 0 else "", row["format_key"] if i == 0 else "", b["name"], b["dtype"],
                "x".join(map(str, b["shape"])), human(b["bytes_per_expert"]), human(b["stored_nbytes"]),
                b["codec"], f"{b['ratio']:.2f}",
            )
        t.add_section()
    out.print(t)
    tot = s["totals"]
    out.print(
        f"{tot['moe_layers']} MoE layers, experts {human(tot['expert_stored_nbytes'])} stored "
        f"({human(tot['expert_raw_nbytes'])} raw); {len(s['tensors'])} other tensors "
        f"{human(tot['tensor_nbytes'])}; {len(s['attachments'])} attachments "
        f"({', '.join(a['name'] for a in s['attachments'])})"
    )


# -- verify -------------------------------------------------------------------------------
@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--threads", type=int, help="Checksum threads (default: up to 4).")
@click.option("--json", "as_json", is_flag=True)
def verify(file: str, threads: int | None, as_json: bool) -> None:
    """Check an FTW file's structure and every checksum."""
    import ftw

    with ftw.open(file) as f:
        total = sum(b.nbytes for _, b in f.blobs())
        with progress_bar(total, "verify", as_json) as advance:
            checked = f.verify(threads=threads, progress=advance)
        n = sum(1 for _ in f.blobs())
    if as_json:
        emit_json({"file": file, "ok": True, "blobs": n, "nbytes": checked})
    else:
        out.print(f"[green]ok[/] {file}: {n} blobs, {human(checked)} checked")


def main() -> None:
    try:
        rc = cli.main(standalone_mode=False)
    except FtwError as e:
        err.print(f"[red]error:[/] {e}", highlight=False, markup=True, soft_wrap=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):
        err.print("[red]interrupted[/]: nothing was written")
        sys.exit(130)
    except OSError as e:
        err.print(f"[red]error:[/] {e.filename or ''}: {e.strerror or e}", highlight=False)
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
