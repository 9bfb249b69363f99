"""VRAM lifecycle wrappers: staged placement of module weights across disk, host and accelerator.

Owns: the wrapper state machine (`autotorch`), the wrapped Linear (`linear`) and module wrappers
(`module`), installing them on a model (`enable`), FP8 and LoRA compute (`fp8`, `lora`), and the
optional `vram` profile section (`vram_section`, `disk_tier`).
Must not know: the offload-profile wire format beyond the plain data of its own section.
This package file imports nothing so that the torch-free `vram_section` stays torch-free.
"""
