"""Remote MCP tools (docs/tools.md, "Remote MCP tools"): servers an agent profile names or a
request adds, listed before a run's prompts are admitted and called over streamable HTTP.

- :mod:`~app.agent.mcp.servers`: what a server is (:class:`McpServer`, its approval policy and
  timeouts);
- :mod:`~app.agent.mcp.client`: connecting, listing and calling (:class:`McpClient`);
- :mod:`~app.agent.mcp.cache`: listings kept per process (:class:`ListingCache`);
- :mod:`~app.agent.mcp.toolset`: the MCP tools of one run and how a call is run.
"""

from .cache import ListedTool, Listing, ListingCache
from .client import McpClient, McpFailure
from .servers import BUILTIN_LABEL, NAME, ApprovalPolicy, McpServer, McpTimeouts
from .toolset import McpTool, McpToolset, RunTools, build, list_servers

__all__ = [
    "BUILTIN_LABEL",
    "NAME",
    "ApprovalPolicy",
    "ListedTool",
    "Listing",
    "ListingCache",
    "McpClient",
    "McpFailure",
    "McpServer",
    "McpTimeouts",
    "McpTool",
    "McpToolset",
    "RunTools",
    "build",
    "list_servers",
]
