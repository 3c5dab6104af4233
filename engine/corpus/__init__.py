"""Labeling a corpus that never enters the workspace: read it in batches, apply the pool and the aggregator
fitted once on the workspace's dev rows, and write Parquet shards plus a manifest.

`reading` finds and reads the input files (Parquet / CSV / JSONL) in batches with stable row ids; `labeler`
is the fitted, picklable labeler shipped to workers; `shards` owns the output folder (temp-then-rename
shards, the run record that refuses mixing runs, the manifest written last); `engines` runs the batches
in-process (`local`) or on a Ray cluster (`ray`, imported only there). Workers never write the workspace.
"""
