"""Figures: dev fitness and the pool's analytics (`score`), and honest estimates with an interval (`estimate`)."""
