"""The Llama-family model an agent serves: architecture, config, weights, tokenizer, chat template."""
