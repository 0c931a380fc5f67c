use clap::Parser;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            // The SDK logs every request at INFO: keep it to warnings unless asked.
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                "info,openstack_sdk=warn,openstack_sdk_core=warn,openstack_sdk_auth_core=warn"
                    .into()
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    capo_rs::cli::run(capo_rs::cli::Cli::parse())
}
