#!/usr/bin/env python3
"""The GPU panel's real check, for a machine with an NVIDIA GPU (not run by CI).

Reads every GPU through rampwatch's NvmlReader twice, a second apart, and
prints the readings beside nvidia-smi's own, so units (W, bytes, MHz, °C) and
per-field fallbacks can be compared by eye; exits 1 if NVML fails or a field
that nvidia-smi reports comes back empty.

usage: python tests/device_nvml_check.py
"""

from __future__ import annotations

import subprocess
import sys
import time

from rampwatch.drivers.telemetry.gpu import NvmlReader


def smi() -> list[list[str]]:
    q = "index,name,utilization.gpu,memory.used,memory.total,power.draw,power.limit,clocks.sm,temperature.gpu"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]


def main() -> int:
    try:
        reader = NvmlReader()
    except Exception as e:  # noqa: BLE001 - no driver, no GPU: say so in one line
        print(
            f"device_nvml_check: NVML unavailable here ({e}); run it on a machine with an NVIDIA GPU", file=sys.stderr
        )
        return 2
    bad = 0
    for _ in range(2):
        readings = reader.read()
        for g, ref in zip(readings, smi()):
            print(
                f"rampwatch gpu{g.index} {g.name}: util {g.util}% mem {g.mem_used and g.mem_used / 2**20:.0f}/"
                f"{g.mem_total and g.mem_total / 2**20:.0f} MiB power {g.power}/{g.power_limit} W "
                f"sm {g.sm_clock} MHz temp {g.temp} C"
            )
            print(
                f"nvidia-smi gpu{ref[0]} {ref[1]}: util {ref[2]}% mem {ref[3]}/{ref[4]} MiB power {ref[5]}/{ref[6]} W "
                f"sm {ref[7]} MHz temp {ref[8]} C"
            )
            for value, ref_value in (
                (g.util, ref[2]),
                (g.mem_used, ref[3]),
                (g.power, ref[5]),
                (g.sm_clock, ref[7]),
                (g.temp, ref[8]),
            ):
                if value is None and ref_value not in ("[N/A]", "[Not Supported]"):
                    bad += 1
        time.sleep(1)
    reader.close()
    print("OK" if not bad else f"{bad} fields empty that nvidia-smi reports")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
