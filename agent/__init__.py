"""The agent: LangGraph and deepagents under Chital's harness (agent/harness.py)."""

import os

# LangGraph reads this once, when it is imported: snapshot every delta channel at least this often,
# so a thread's pruned checkpoints stay few (agent/compaction.py, MAX_SUPERSTEPS_SINCE_SNAPSHOT).
os.environ.setdefault("LANGGRAPH_DELTA_MAX_SUPERSTEPS_SINCE_SNAPSHOT", "200")
