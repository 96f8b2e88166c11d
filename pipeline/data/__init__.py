"""From JSONL files to what training reads: records, the built-in corpus, the shard plan, the
tokenizer, tokenization into Megatron's indexed format, verification, splits, the dataset
index cache, megatron-core's datasets and the evaluation sets."""
