"""EvoPool engine: evolve a pool of executable annotators and aggregate their votes. Never imports streamlit."""
