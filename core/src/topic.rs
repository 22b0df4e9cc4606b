//! Topic names, as Kafka allows them.

/// Kafka's limit on topic name length.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// Partitions per topic. Kafka has no limit; this one keeps a typo such as 1000000, or a
/// hostile 4,000,000,000, from costing every controller and broker its memory. The
/// controllers refuse a larger count before it reaches the metadata log.
pub const MAX_PARTITIONS: u32 = 10_000;

/// Checks a topic name against Kafka's rules.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("topic name is empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("topic name '{name}' is not allowed"));
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return Err(format!(
            "topic name is {} characters long; the limit is {MAX_TOPIC_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "topic name '{name}' contains '{bad}'; only ASCII letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_settle-2").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a/b").is_err());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
    }
}
