"""Streamed data: packed shards in a folder or an object store, read by position so a stopped run resumes exactly."""
