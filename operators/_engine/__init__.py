"""The Spark-free engine: the pipeline graph, a task's run of one batch, the
order of a stage's input rows, Spark's hash partitioning, and the watermark
rule. Nothing here imports PySpark."""
