"""The model in the Hugging Face format: its config, weight names and files (pipeline.exporting
writes a trained model this way; model.init_from starts a run from a Llama written this way)."""
