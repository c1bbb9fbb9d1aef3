"""One shard job: the images checked by a pool of workers, the records written, the counts."""
