"""The model: loading, pre-prefill checks, prompting, and the attention kvcore installs."""
