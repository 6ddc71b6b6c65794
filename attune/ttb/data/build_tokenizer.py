"""Build the small test tokenizer committed beside this file (tiny-chat-tokenizer/).

A byte-level BPE tokenizer trained with the `tokenizers` library on the committed sample
conversations (sft_sample.jsonl), with a chat template of our own in the Hugging Face
`tokenizer_config.json` layout. It stands in for a model's real tokenizer in tests: the TTB workload
builder reads it through the same code path as a downloaded `tokenizer.json`.

    python attune/ttb/data/build_tokenizer.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
OUT = HERE / "tiny-chat-tokenizer"
SPECIAL = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>"]
TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unsupported role ' + message['role']) }}{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def texts() -> list[str]:
    out = []
    for line in (HERE / "sft_sample.jsonl").read_text(encoding="utf-8").splitlines():
        for m in json.loads(line)["messages"]:
            out.append(m["content"])
    return out


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=640, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer=trainer)
    OUT.mkdir(exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    cfg = {"name_or_path": "attune-tiny-chat", "eos_token": "<|endoftext|>", "bos_token": None,
           "chat_template": TEMPLATE,
           "note": "built by attune/ttb/data/build_tokenizer.py from sft_sample.jsonl; for tests only"}
    (OUT / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    print(f"{OUT}: vocabulary {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
