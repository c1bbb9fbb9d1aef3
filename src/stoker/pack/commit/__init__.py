"""The commit: a destination (a folder or a URL) takes each shard, then the set's files."""
