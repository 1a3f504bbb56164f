"""The metadata service's contract: messages, their protobuf codec, the client, node records, hit counts."""
