"""Delivery of due messages by topic type: webhook and stream sinks (push) and pull leasing."""
