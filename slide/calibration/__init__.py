"""Measuring the machine a plan runs on: the GPU's kernels (`gpu_probes`, `shape_probes`), its
link, the host AdamW and the drive (`host_rate_probes`) timed as the executor runs them, with the
figures and clocks they share (`probe_common`); the host's DRAM, cores and disks and the probe
sizes (`host_probes`), and the profile `--machine auto` builds from them and caches per host
(`auto_machine`)."""
