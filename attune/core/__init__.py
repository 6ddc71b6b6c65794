"""The stdlib-only core: the ledger, its fold into campaign state, the measurement rule, the vocabulary
and the campaign directory's paths. Hooks may import this layer and nothing else of attune; it
imports nothing outside the standard library."""
