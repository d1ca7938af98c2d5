"""Operations tools behind the ``relstate`` command: inspect, repartition,
and the demo job."""
