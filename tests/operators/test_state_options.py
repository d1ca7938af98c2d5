"""The options of the relstate-state and relstate-metadata data sources,
checked without Spark: Spark's spellings, and clear errors for unknown or
contradictory ones."""

from __future__ import annotations

from typing import Any

import pytest

from operators._spark.state_options import ReadRequest
from operators.errors import InputError

PATH = {"path": "/some/checkpoint"}


class TestReadRequest:
    def test_spark_spellings_and_aliases_read_the_same(self) -> None:
        """batchId, changeStartBatchId, changeEndBatchId and readChangeFeed
        (Spark's spellings, any case) mean what batch_id, startBatchId and
        endBatchId mean."""
        spark = ReadRequest.of({**PATH, "BATCHID": "3", "joinSide": "left"})
        ours = ReadRequest.of({**PATH, "batch_id": 3, "joinside": "left"})
        assert spark == ours and spark.batch_id == 3 and spark.join_side == "left"
        feed = {"readChangeFeed": "TRUE", "changeStartBatchId": 1, "changeEndBatchId": "4"}
        alias = {"readchangefeed": "true", "startBatchId": "1", "endBatchId": 4}
        assert ReadRequest.of({**PATH, **feed}) == ReadRequest.of({**PATH, **alias})
        assert ReadRequest.of({**PATH, **feed}).version == 4

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"batchid": 1, "bogus": 2}, r"has no option 'bogus'; its options are path, "),
            ({"operatorId": 0}, r"no option 'operatorId': relstate names operators"),
            ({"storeName": "left"}, r"give option 'table' \(a join's side: option 'joinSide'\)"),
            ({"batchId": 1, "batch_id": 1}, r"'batchId' and 'batch_id' are the same option"),
            ({"changeStartBatchId": 1}, r"belong to the change feed: add option readChangeFeed"),
            ({"endBatchId": 1}, r"belong to the change feed"),
            ({"readChangeFeed": "true"}, r"readChangeFeed needs option changeStartBatchId"),
            (
                {"readChangeFeed": "true", "changeStartBatchId": 1, "batchId": 2},
                r"give changeStartBatchId and changeEndBatchId instead of batchId",
            ),
            ({"readChangeFeed": "yes"}, r"readChangeFeed is 'true' or 'false', got 'yes'"),
            ({"joinSide": "left", "table": "left"}, r"joinSide and table both name"),
            ({"joinSide": "both"}, r"joinSide is 'left' or 'right', got 'both'"),
            ({"batchId": "-1"}, r"batchId must be an integer >= 0, got '-1'"),
            ({"partition": "one"}, r"partition must be an integer >= 0, got 'one'"),
        ],
    )
    def test_unknown_or_contradictory_options_are_refused(
        self, options: dict[str, Any], message: str
    ) -> None:
        """An unknown option, one given under two spellings, or options that
        contradict each other raise InputError saying what to give."""
        with pytest.raises(InputError, match=message):
            ReadRequest.of({**PATH, **options})

    def test_metadata_takes_path_batch_and_s3_only(self) -> None:
        """relstate-metadata takes batchId and the S3 options; a table option
        there is refused rather than ignored."""
        request = ReadRequest.of({**PATH, "batchId": 2, "region": "r"}, "relstate-metadata")
        assert (request.batch_id, request.s3) == (2, {"region": "r"})
        with pytest.raises(InputError, match="relstate-metadata has no option 'table'"):
            ReadRequest.of({**PATH, "table": "t"}, "relstate-metadata")

    def test_path_is_required(self) -> None:
        """A read without a path says how to give one."""
        with pytest.raises(InputError, match=r'format\("relstate-state"\).option\("path"'):
            ReadRequest.of({"batchId": 1})
