"""The LLM proposer: `proposer` asks the model for annotator code (or, for small models, a JSON spec that
`spec_mode` turns into code), with prompts built in `prompts`."""
