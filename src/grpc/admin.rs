//! AdminService: the operators' audit view of every call and outcome.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{parse, render};
use crate::broker::Broker;
use crate::error::Error;
use crate::proto::v1 as pb;

pub struct AdminApi {
    broker: Arc<Broker>,
}

impl AdminApi {
    pub fn new(broker: Arc<Broker>) -> Self {
        Self { broker }
    }
}

#[tonic::async_trait]
impl pb::admin_service_server::AdminService for AdminApi {
    async fn list_calls(
        &self,
        request: Request<pb::ListCallsRequest>,
    ) -> Result<Response<pb::ListCallsResponse>, Status> {
        let req = request.into_inner();
        let mut query = parse::filter(
            "",
            Some(pb::CallFilter {
                session_id: req.session_id,
                workspace: String::new(),
                tool: req.tool,
                agent: req.agent,
            }),
        )?;
        query.statuses = parse::statuses("statuses", req.statuses)?;
        query.created_after = parse::time_bound("created_after", req.created_after)?;
        query.created_before = parse::time_bound("created_before", req.created_before)?;
        parse::page(&mut query, req.page_size, &req.page_token)?;
        let page = self.broker.store().list_calls(&query).await?;
        Ok(Response::new(pb::ListCallsResponse {
            calls: page.calls.iter().map(render::call).collect(),
            next_page_token: parse::page_token(page.next),
        }))
    }

    async fn get_call(
        &self,
        request: Request<pb::GetCallRequest>,
    ) -> Result<Response<pb::Call>, Status> {
        let req = request.into_inner();
        let key = parse::call_key(req.agent, req.session_id, req.call_id)?;
        let found = self
            .broker
            .store()
            .calls_by_id(&key.agent, &key.session, std::slice::from_ref(&key.call_id))
            .await?;
        match found.into_iter().next().flatten() {
            Some(call) => Ok(Response::new(render::call(&call))),
            None => Err(Error::NotFound(format!(
                "no call `{}` in session `{}` of agent `{}`",
                key.call_id, key.session, key.agent
            ))
            .into()),
        }
    }
}
