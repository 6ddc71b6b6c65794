"""tinygpt: a small, real GPT training workload for attune's embedded default (CPU or GPU).

Entry point: ``examples/tinygpt/train.py`` (torchrun). Modules: ``config`` (flags and resolved
arguments), ``data`` (hash-checked packed rows), ``model`` (GPT, optional MoE), ``reducer``
(bucketed data-parallel gradient reduction), ``megatron_log`` (Megatron-LM log lines), ``trainer``.
"""
