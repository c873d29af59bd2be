"""Looped models to and from the Hugging Face ecosystem.

export.py writes a trained looped model as a folder that `transformers` loads
(`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`) and lm-eval's
`hf` backend scores; retrofit.py initialises a looped model from a Hugging Face
Mamba-2 or Llama checkpoint (embeddings, head, and N of its layers as the shared
block). Both import transformers lazily, inside functions.
"""
