//! What the MCP benches share: an rmcp client of `envctl mcp` over stdio, and a tool call that
//! must succeed.

use std::path::Path;

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};

/// A client of `bin mcp` in `dir`, over stdio, with no inherited environment settings.
pub async fn connect_stdio(bin: &str, dir: &Path) -> RunningService<RoleClient, ()> {
    let transport = TokioChildProcess::new(tokio::process::Command::new(bin).configure(|cmd| {
        cmd.arg("-C")
            .arg(dir)
            .arg("mcp")
            .env_remove("ENVIRONMENT_ACTOR")
            .env_remove("ENVIRONMENT_SOCKET")
            .env_remove("ENVIRONMENT_DIR");
    }))
    .unwrap();
    ().serve(transport).await.unwrap()
}

/// Calls `tool` with `args`; a failed call fails the bench.
pub async fn call(client: &RunningService<RoleClient, ()>, tool: &str, args: serde_json::Value) {
    let args = args.as_object().cloned().unwrap_or_default();
    let r = client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{tool}: {r:?}");
}
