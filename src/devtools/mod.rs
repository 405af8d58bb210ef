//! Tools that act as the other parties: the DB owner (creating the inbox tables in a dev/test
//! database) and upstream (writing messages). The service itself never calls these.

pub mod fixture;
pub mod messages;
pub mod simulator;
