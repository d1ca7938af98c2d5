"""The Spark runtime: starting a query and its options, the driver's batch
protocol, the plan, progress, the worker task, the session, sinks and
output files, and the data sources that read outputs and state."""
