//! The API tests' kit, one file per job: in-process brokers on a fresh database and the
//! `backend_tests!` macro that runs one test body on each backend (`spawn`), the real binary as a
//! process (`process`), the agent-host hooks run as their hosts run them (`hooks`), request
//! builders (`requests`), one RPC with its answer (`clients`), open streams read with patience
//! (`streams`) and shared assertions (`assertions`). What the crash harness and the bench share
//! with these tests is the `testkit` crate's.

use std::time::Duration;

mod assertions;
mod clients;
mod hooks;
mod process;
mod requests;
mod spawn;
mod streams;

pub use assertions::*;
pub use clients::*;
pub use hooks::*;
pub use process::*;
pub use requests::*;
pub use spawn::*;
pub use streams::*;

/// How long a test waits for something the broker should send before it fails.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Defines, for each named `async fn name(app: TestApp)` of the module, the tests
/// `name::sqlite` and `name::postgres`: the same body against each backend. `name => |config|
/// ...` adjusts the broker's configuration first.
macro_rules! backend_tests {
    ($($name:ident $(=> $configure:expr)?),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    let app = crate::helpers::spawn_app_on(
                        crate::helpers::Backend::Sqlite,
                        crate::helpers::backend_tests!(@configure $($configure)?),
                    )
                    .await;
                    super::$name(app).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(
                    not(approvals_test_postgres),
                    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
                )]
                async fn postgres() {
                    let app = crate::helpers::spawn_app_on(
                        crate::helpers::Backend::postgres(),
                        crate::helpers::backend_tests!(@configure $($configure)?),
                    )
                    .await;
                    super::$name(app).await;
                }
            }
        )*
    };
    (@configure $configure:expr) => { $configure };
    (@configure) => { |_: &mut approval_broker::config::Config| {} };
}

pub(crate) use backend_tests;
