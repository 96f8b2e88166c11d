"""The export stage: a trained checkpoint as a Hugging Face model folder with its tokenizer."""
