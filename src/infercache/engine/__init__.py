"""The built-in inference engine: a Llama-family model with radix-tree KV prefix reuse."""
