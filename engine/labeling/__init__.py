"""From the pool's votes to soft labels: the text features (`features`), fitting on dev and labeling every row
with honest dev scores (`fit`), and evaluation on a split and the aggregators compared (`evaluate`).

Aggregators are fitted on dev labels only (Dawid–Skene, which needs no labels, on every row's votes).
Dev rows get out-of-fold predictions, so every dev figure the studio or CLI shows is honest.
Test labels are read only by `evaluate(split="test")`, after fitting.
A multi-label task is labeled by MultiLabelEvoAgg (one binary model per class; "evoagg", "auto" and "auto-pool"
all name it, "embedding" is it without the votes); a row gets every class whose probability reaches `threshold`.
"""
