"""`mtp-cli doctor`: the llama.cpp build, the CPU, the devices, and the CPU self-check run now."""

from __future__ import annotations

import click

from mtp_cli.cli.app import main
from mtp_cli.cli.render import out

# the CPU features that decide llama.cpp's kernels (of /proc/cpuinfo's many flags)
_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


@main.command()
@click.option(
    "--rpc", "rpc", metavar="HOST:PORT,...", envvar="LLAMA_ARG_RPC", help="Also list these rpc-servers' devices."
)
def doctor(rpc: str | None) -> None:
    """Run the CPU self-check now and show the llama.cpp build, the CPU and the devices."""
    from mtp_cli import attention_probe, cpu_check
    from mtp_cli import llama_ext as lx
    from mtp_cli.config import parse_endpoints

    lx.quiet_logs()
    lx.add_rpc_servers(parse_endpoints(rpc, "rpc"))
    verdict = cpu_check.recheck()
    attention_probe.forget()  # (measured again for the next context of several sequences)
    flags = set(cpu_check.cpu_features().split())
    for line in cpu_check.summary_lines():
        out.print(line, highlight=False)
    for setting in cpu_check.candidates(verdict.offered):
        how = verdict.failed.get(setting)
        state = f"died ({how})" if how else "ran" if setting == verdict.setting else "not needed"
        kept = ", ".join(cpu_check.kept_for(setting, verdict.offered)) or "no extra buffers"
        out.print(f"  probe `{setting}` ({kept}): {state}", highlight=False)
    out.print(f"verdict: models load with {', '.join(verdict.kept) or 'no extra buffer types'}", highlight=False)
    features = " ".join(f for f in _FEATURES if f in flags) or "none of " + ", ".join(_FEATURES)
    out.print(f"CPU features: {features}", highlight=False)
    found = [f"{d.name} ({d.description})" for d in lx.devices()]
    out.print(f"devices: {', '.join(found) or 'none found'}", highlight=False)
    fa = (
        "llama.cpp's choice where layers go to a device (off with -ngl 0 or -dev none)"
        if lx.supports_gpu_offload()
        else "off here for one sequence (attention runs on the CPU, where llama.cpp's kernel is slower past ~64 "
        "positions), measured per model shape for several (serve -np N: the verdicts kept are forgotten now)"
    )
    out.print(f"flash attention: -fa auto is {fa}; -fa on turns it on", highlight=False)
    click.echo(f"llama.cpp system: {lx.system_info()}")


__all__ = ["doctor"]
