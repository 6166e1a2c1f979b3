"""Measuring the machine a plan runs on: the GPU, its link and the host AdamW timed as the
executor runs them (`gpu_probes`), the host's DRAM, cores and disks (`host_probes`), and the
profile `--machine auto` builds from them and caches per host (`auto_machine`)."""
