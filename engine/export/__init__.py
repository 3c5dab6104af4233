"""Files out: the labeled dataset, its manifest and the pool as a .py file (`files`); the Hugging Face layout (`hf`)."""
