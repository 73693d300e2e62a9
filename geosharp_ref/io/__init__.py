"""Input and output: models and data from local paths, durable result files.

* :mod:`~geosharp_ref.io.models` — Hugging Face-format directories (never a hub name)
* :mod:`~geosharp_ref.io.clip_soups` — model-soups CLIP ViT-B/32 state dicts
* :mod:`~geosharp_ref.io.data` — the data file format, batches, random batches that fit a model
* :mod:`~geosharp_ref.io.datasets` — data files built from text (CSV/TSV/JSONL) or image folders with the model's
  own tokenizer or image processor (``geosharp data``)
* :mod:`~geosharp_ref.io.durable` — atomic JSON/torch writes, fsync'd appends, torn-line repair
* :mod:`~geosharp_ref.io.machine` — the machine a result was measured on (the CPU's model name)
"""
