"""The `ftw` command: convert, inspect, verify, check, plan.

Commands are thin: they parse options, call the library, and render what it returns as a
rich table or, with --json, as JSON on stdout. Any FtwError ends the command with one line
on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from contextlib import contextmanager

import click
from rich.console import Console
from rich.markup import escape
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


@contextmanager
def progress_bar(total: int, description: str, quiet: bool):
    """Yields advance(nbytes, layers=0); shows bytes, speed, layers and ETA on stderr."""
    if quiet or not err.is_terminal:
        yield lambda n=0, layers=0, total_layers=None: None
        return
    from rich.progress import (  # only for a terminal: the import costs a conversion 10-20 ms
        BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn,
        TransferSpeedColumn,
    )

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
        limit = max([f.model.num_layers if f.model else 0, *(l + 1 for l in f.layers)], default=0)
        s = summarize(f, parse_layers(layers, limit))
    if as_json:
        emit_json(s)
        return
    render_summary(s)


def lit(x) -> str:
    """User text (paths, names from an index or a checkpoint) as rich prints it literally:
    '[/bold]' in a file name must neither raise nor vanish, a newline not break the line."""
    return escape(one_line(str(x)))


RICH_TABLE_ROWS = 2000  # rich lays a table out at ~0.5 ms a row: past this, plain columns


def print_table(title: str, columns: tuple[str, ...], right: tuple[str, ...], rows: list[list[str]],
                no_wrap: bool = False) -> None:
    """A table of user text (printed literally). Large ones (a 65,536-layer index) are plain
    aligned columns written in one pass: linear, ~1 us a row, where rich takes minutes."""
    if len(rows) <= RICH_TABLE_ROWS:
        t = Table(title=title, title_justify="left")
        for c in columns:
            t.add_column(c, justify="right" if c in right else "left", no_wrap=no_wrap)
        for r in rows:
            t.add_row(*map(lit, r))
        out.print(t)
        return
    cells = [[one_line(c) for c in r] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    fmt = "  ".join(f"{{:{'>' if c in right else '<'}{w}}}" for c, w in zip(columns, widths))
    lines = [title, fmt.format(*columns), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in cells]
    out.file.write("\n".join(lines) + "\n")


def render_summary(s: dict) -> None:
    m = s["model"] or {}
    prov = s["provenance"]
    out.print(f"[bold]{lit(s['file'])}[/]  FTW v{s['version'][0]}.{s['version'][1]}, {human(s['file_nbytes'])}")
    if prov:
        out.print(f"  from {lit(prov.get('reader', '?'))}: {lit(prov.get('source', '?'))} "
                  f"(ftw {lit(prov.get('tool_version', '?'))})")
    if m:
        out.print(
            f"  model [cyan]{lit(m['family'])}[/]: H={m['hidden_size']} I={m['moe_intermediate_size']} "
            f"E={m['num_experts']} top_k={m['top_k']} layers={m['num_layers']} "
            f"MoE layers={format_layers(m['moe_layers'])} activation={lit(m['activation'])}"
        )
    print_table("Layer formats", ("format", "options", "layers", "count", "expert bytes"), ("count", "expert bytes"), [
        [f["name"], json.dumps(f["options"]) if f["options"] else "", format_layers(f["layers"]),
         str(len(f["layers"])), human(f["raw_nbytes"])]
        for f in s["formats"]
    ])
    print_table(
        "Banks", ("layer", "format", "bank", "dtype", "shape", "per expert", "total", "codec", "ratio"),
        ("per expert", "total", "ratio", "layer"),
        [[str(row["layer"]) if i == 0 else "", row["format_key"] if i == 0 else "", b["name"], b["dtype"],
          "x".join(map(str, b["shape"])), human(b["bytes_per_expert"]), human(b["stored_nbytes"]),
          b["codec"], f"{b['ratio']:.2f}"]
         for row in s["layers"] for i, b in enumerate(row["banks"])],
        no_wrap=True,
    )
    tot = s["totals"]
    out.print(
        f"{tot['moe_layers']} MoE layers, experts {human(tot['expert_stored_nbytes'])} stored "
        f"({human(tot['expert_raw_nbytes'])} raw); {len(s['tensors'])} other tensors "
        f"{human(tot['tensor_nbytes'])}; {len(s['attachments'])} attachments "
        f"({lit(', '.join(a['name'] for a in s['attachments']))})"
    )


# -- verify -------------------------------------------------------------------------------
@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--threads", type=click.IntRange(min=1), help="Checksum threads (default: up to 4).")
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
        out.print(f"[green]ok[/] {lit(file)}: {n} blobs, {human(checked)} checked")


# -- convert ------------------------------------------------------------------------------
def parse_compress(text: str | None) -> int | None:
    if text is None:
        return None
    name, colon, level = text.partition(":")
    # ASCII only: '²'.isdigit() is true and int('²') a ValueError
    if name != "zstd" or (colon and not re.fullmatch(r"-?[0-9]{1,7}", level)):
        raise FtwError(f"--compress: expected zstd or zstd:LEVEL (an integer), got {text!r}")
    from ftw.writers.ftw_writer import check_level

    return check_level(int(level) if level else 3)


@cli.command()
@click.argument("src", type=click.Path())
@click.argument("dst", type=click.Path(dir_okay=False))
@click.option("--layers", help="Only these MoE layers, e.g. 0-3,10 (their non-expert tensors too).")
@click.option("--experts-only", is_flag=True, help="Leave out non-expert tensors.")
@click.option("--compress", help="zstd or zstd:LEVEL: compress each expert row where it pays.")
@click.option("--threads", type=click.IntRange(min=1), help="Compression threads.")
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
@click.option("--json", "as_json", is_flag=True)
def convert(src, dst, layers, experts_only, compress, threads, dry_run, force, as_json) -> None:
    """Convert a checkpoint (HF folder, .gguf, first file of a split .gguf) into DST.ftw."""
    import os

    from ftw.errors import DestinationExistsError
    from ftw.readers import open_checkpoint
    from ftw.writers.convert import plan_conversion, write_plan

    level = parse_compress(compress)
    if not dry_run and os.path.exists(dst) and not force:
        raise DestinationExistsError(f"{dst}: exists (use --force to replace it)")
    with open_checkpoint(src) as reader:
        plan = plan_conversion(reader, parse_layers(layers, reader.model.num_layers), experts_only)
        if not dry_run:
            total = plan.expert_nbytes + plan.tensor_nbytes
            with progress_bar(total, "convert", as_json) as advance:
                write_plan(plan, reader, dst, force=force, compress_level=level, threads=threads,
                           progress=lambda n=0, layers=0: advance(n, layers, len(plan.layers)))
    result = plan.to_json() | {"destination": None if dry_run else dst, "dry_run": dry_run}
    if as_json:
        emit_json(result)
        return
    t = Table(title=("Plan (dry run: nothing written)" if dry_run else f"Converted into {lit(dst)}"), title_justify="left")
    for c in ("layer", "format", "options", "banks", "expert bytes"):
        t.add_column(c, justify="right" if c in ("layer", "expert bytes") else "left")
    for row in result["layers"]:
        t.add_row(str(row["layer"]), lit(row["format"]), lit(json.dumps(row["options"])) if row["options"] else "",
                  lit(", ".join(row["banks"])), human(row["nbytes"]))
    out.print(t)
    out.print(f"{len(plan.layers)} MoE layers from {lit(plan.reader)}: experts {human(plan.expert_nbytes)}, "
              f"{len(plan.tensors)} other tensors {human(plan.tensor_nbytes)}, "
              f"attachments: {lit(', '.join(sorted(plan.attachments)) or 'none')}")


# -- check --------------------------------------------------------------------------------
@cli.command()
@click.argument("src", type=click.Path())
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--experts", default=3, show_default=True, type=click.IntRange(min=0),
              help="Experts per layer decoded from both the file and the source's own tensors.")
@click.option("--runtime", type=click.Choice(["none", "cpu", "cuda", "auto"]), default="none", show_default=True,
              help="Also push random tokens through a runtime (auto: cuda where a GPU is, else cpu).")
@click.option("--strict", is_flag=True, help="A layer the runtime cannot run fails the check.")
@click.option("--seed", type=int, help="Seed of the runtime step's random tokens.")
@click.option("--threads", type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True)
def check(src, file, experts, runtime, strict, seed, threads, as_json) -> None:
    """Prove FILE holds what converting SRC gives: model, layers, formats, every bank byte,
    tensors and attachments; sample experts decoded from the file and from SRC's own tensors;
    with --runtime, random tokens through the CPU executor or the GPU pools and kernels."""
    import ftw
    from ftw.check import check as run_check
    from ftw.readers import open_checkpoint

    with ftw.open(file) as f, open_checkpoint(src) as reader, \
            progress_bar(sum(b.nbytes for _, b in f.blobs()), "check", as_json) as advance:
        report = run_check(reader, f, experts=experts, runtime=runtime, strict=strict, seed=seed,
                           threads=threads, progress=lambda n=0, layers=0: advance(n, layers, len(f.layers)))
    if as_json:
        emit_json(report.to_json())
    else:
        t = Table(title=f"ftw check {lit(src)} -> {lit(file)}: {lit(report.selection)}", title_justify="left")
        cols = ["layer", "format", "banks", "bytes compared", "experts decoded", "max |error|", "max rel error"]
        if report.runtime != "none":
            cols.append(f"{report.runtime}: tokens, rel error" +
                        ("; pool hits/misses/evictions" if report.runtime == "cuda" else ""))
        for c in cols + ["result"]:
            t.add_column(c, justify="left" if c in ("format", "result") else "right")
        for r in report.layers.values():
            row = [str(r.layer), lit(r.format), str(r.banks), human(r.bytes_compared), str(r.experts_decoded),
                   f"{r.max_abs_err:.3g}", f"{r.max_rel_err:.3g}"]
            if report.runtime != "none":
                rt = r.runtime or {}
                pool = rt.get("pool") or {}
                row.append((f"{rt['tokens']}, {rt['max_rel_err']:.2g}"
                            + (f"; pool {pool.get('hits', 0)}/{pool.get('misses', 0)}/{pool.get('evictions', 0)}"
                               if pool else "")) if rt.get("run")
                           else f"not run on {report.runtime}" if rt else "-")
            row.append(f"[red]{escape(r.problems[0])}[/]" if not r.ok else
                       "[green]ok[/]" + (f" [yellow]({escape(r.notes[0])})[/]" if r.notes else ""))
            t.add_row(*row)
        out.print(t)
        out.print(f"model and selection compared; {report.tensors_compared} other tensors "
                  f"({human(report.tensor_bytes_compared)}) and {report.attachments_compared} attachments compared")
        for p in report.all_problems():
            out.print(f"[red]difference:[/] {escape(p)}")
    if not report.ok:
        problems = report.all_problems()
        raise FtwError(f"{file}: {len(problems)} difference(s) from {src}; first: {problems[0]}")


# -- plan ---------------------------------------------------------------------------------
@cli.command()
@click.argument("file", type=click.Path(dir_okay=False), required=False)
@click.option("--gpu-mem", help="GPU memory for the pools, staging and slot tables, e.g. 40GiB.")
@click.option("--slots", "slots_text", help="Or: cache slots over all pools, a count or a share of all experts (10%).")
@click.option("--decode-batch", type=click.IntRange(min=0), default=0, show_default=True,
              help="Decode batch every pool must hold (0: the largest the budget allows).")
@click.option("--prefill-chunk", type=click.IntRange(min=0), default=2048, show_default=True,
              help="Tokens per prefill chunk (0: no staging region).")
@click.option("--staging-experts", type=click.IntRange(min=1), default=8, show_default=True,
              help="Experts of the widest format per staging half.")
@click.option("--experts", "E", type=click.IntRange(min=1), help="Model by flags: experts per layer (E).")
@click.option("--hidden", "H", type=click.IntRange(min=1), help="Model by flags: hidden size (H).")
@click.option("--intermediate", "I", type=click.IntRange(min=1), help="Model by flags: expert intermediate size (I).")
@click.option("--top-k", type=click.IntRange(min=1), help="Routed experts per token (a FILE's own by default).")
@click.option("--layers", "num_layers", type=click.IntRange(min=1), help="Model by flags: MoE layers.")
@click.option("--format", "formats", multiple=True,
              help="Model by flags: FMT (the default), FMT:LAYERS or FMT{json options}:LAYERS; repeatable.")
@click.option("--json", "as_json", is_flag=True)
def plan(file, gpu_mem, slots_text, decode_batch, prefill_chunk, staging_experts, E, H, I, top_k,  # noqa: E741
         num_layers, formats, as_json) -> None:
    """Size the GPU slot pools before serving: per format, the slots, the share of experts
    cached, the decode batch each pool holds, and the prefill staging region; or the minimum
    budget that would fit. Takes an FTW FILE (header only) or a model given by flags."""
    from ftw.runtime import pools

    if (gpu_mem is None) == (slots_text is None):
        raise FtwError("plan: give one budget, --gpu-mem SIZE or --slots N")
    budget = {"gpu_mem": gpu_mem, "decode_batch": decode_batch, "prefill_chunk": prefill_chunk,
              "staging_experts": staging_experts}
    if file is not None:
        if any(x is not None for x in (E, H, I, num_layers)) or formats:
            raise FtwError("plan: give a FILE or a model by flags, not both")
        if slots_text is not None:
            import ftw

            with ftw.open(file) as f:
                total = sum(next(iter(b.values())).num_experts for b in f.layers.values())
            budget["slots"] = pools.parse_slots(slots_text, total)
        p = pools.plan_file(file, top_k=top_k, **budget)
    else:
        missing = [n for n, v in (("--experts", E), ("--hidden", H), ("--intermediate", I), ("--top-k", top_k),
                                  ("--layers", num_layers)) if v is None] + ([] if formats else ["--format"])
        if missing:
            raise FtwError(f"plan: without a FILE, the model needs {', '.join(missing)}")
        layer_formats = pools.parse_format_specs(formats, num_layers)
        if slots_text is not None:
            budget["slots"] = pools.parse_slots(slots_text, num_layers * E)
        p = pools.plan_model(E, top_k, H, I, layer_formats, **budget)
    if as_json:
        emit_json(p)
        return
    render_plan(p)


def render_plan(p: dict) -> None:
    any_b = "any"
    dims = f"H={p['hidden_size']} I={p['intermediate_size']} " if "hidden_size" in p else ""
    out.print(f"[bold]slot pools[/]: {dims}E={p['num_experts']} top_k={p['top_k']}, "
              f"decode batch {any_b if p['decode_batch'] < 0 else p['decode_batch']} in every pool, "
              f"prefill chunk {p['prefill_chunk']}")
    t = Table(title="Pools (one per format)", title_justify="left")
    for c in ("format", "layers", "count", "bytes/expert", "slots", "cached", "pool bytes", "decode batch",
              "staged/pass"):
        t.add_column(c, justify="left" if c in ("format", "layers") else "right")
    for q in p["pools"]:
        t.add_row(lit(q["format"]), format_layers(q["layers"]), str(len(q["layers"])), human(q["expert_bytes"]),
                  str(q["slots"]), f"{100 * q['share']:.1f}%", human(q["bytes"]),
                  any_b if q["decode_batch"] < 0 else str(q["decode_batch"]), str(q["staging_group"]))
    out.print(t)
    out.print(f"staging: {human(p['staging_bytes'])} (two halves, its own region, shared by the pools); "
              f"slot tables {human(p['table_bytes'])}; total {human(p['total_bytes'])} for "
              f"{p['total_slots']} slots")
    out.print(f"minimum for this decode batch: {p['min_slots']} slots, {human(p['min_gpu_mem'])}")


def one_line(text: str) -> str:
    """A message on one line: a newline or other control character in a path is shown
    escaped, never as a line break."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text) if _CONTROL.search(text) else text


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def fail(message: str) -> None:
    err.print(f"[red]error:[/] {escape(one_line(message))}", highlight=False, soft_wrap=True)


def run() -> int:
    """The command's exit status; every failure reported on one line of stderr."""
    try:
        rc = cli.main(standalone_mode=False)
    except FtwError as e:
        fail(str(e))
        return 1
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.exceptions.Abort:
        return interrupted()
    except OSError as e:
        where = ": ".join(str(x) for x in (e.filename, e.filename2) if x is not None) or "(no file named)"
        fail(f"{where}: {e.strerror or e}")
        return 1
    return rc if isinstance(rc, int) else 0


def interrupted() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not add a traceback
    from ftw.writers.atomic import committed

    done = committed()  # what the file system says, whenever the interrupt landed
    if done:
        err.print(f"[red]interrupted[/] after {lit(', '.join(done))} was written in full "
                  f"(committed before the interrupt)", highlight=False, soft_wrap=True)
    else:
        err.print("[red]interrupted[/]: nothing was written")
    return 130


def main() -> None:
    try:
        code = run()
    except KeyboardInterrupt:  # during the command, or while its error was being reported
        code = interrupted()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command is over: a late Ctrl-C changes nothing
    sys.exit(code)


if __name__ == "__main__":
    main()
