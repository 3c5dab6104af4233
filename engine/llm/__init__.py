"""The LLM seam, the only package that imports openai: what the agents need (`seam`: LLMClient, LLMReply, the
errors), the settings (`config`), the adapter for any OpenAI-compatible endpoint (`client`) over its HTTP layer
(`transport`), reading the server (`adapt`, `presets`), and prices and the spending budget (`costs`).
May import `engine.domain` and `engine.store`.
"""
