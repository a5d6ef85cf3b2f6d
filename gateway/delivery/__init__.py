"""Getting an answer into the chat: one streaming state machine for every platform, the per-chat
pacer, and the replies parked after a transient failure."""
