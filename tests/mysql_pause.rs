//! The MariaDB server freezes (SIGSTOP) under a live elector: written next.
#[test]
fn frozen_server_steps_the_leader_down_on_time_and_the_elector_recovers() {
    panic!("not written yet");
}
