"""The LLM seam: the `LLMClient` protocol and the adapter for any OpenAI-compatible endpoint (client.py),
prices and the spending budget (costs.py).

The only package that imports openai. May import `engine.domain` and `engine.store`.
"""
